"""Match records in SQLite: round trips, idempotent inserts, atomic batches, queries, and a
tournament killed mid-step and resumed that ends with exactly the uninterrupted run's records."""

from __future__ import annotations

from pathlib import Path

import pytest
from tournament_sim import play

from agentrt.tournaments.config import build_scheduler
from agentrt.tournaments.ratings import OpenSkillRatings
from agentrt.tournaments.records import MatchStore
from agentrt.tournaments.scheduling import load_state, save_state
from agentrt.tournaments.types import Entrant, Match, MatchResult, Player

ENTRANTS = [Entrant("lm", learning=True), Entrant("random"), Entrant("heuristic")]
SCHEDULE = {"format": "pfsp", "snapshot": {"every": 3, "min_steps": 1}}


def _strength(p: Player) -> float:
    return {"random": -1.0, "heuristic": 0.3}.get(p.policy_id, -1.0 + 0.25 * p.version)


class Killed(Exception):
    """Stands in for the process dying."""


def _run(run_dir: Path, steps: int, kill_at: int | None = None, per_step: int = 10) -> None:
    """The controller loop of a training tournament, checkpointing every 3 steps.

    On start it resumes from ``run_dir/state.json`` when present: scheduler, ratings and step
    come back from the checkpoint and the record store drops what came after it.
    """
    sched = build_scheduler(SCHEDULE, ENTRANTS, ["ttt", "kuhn"], seed=7)
    ratings = OpenSkillRatings()
    state_path = run_dir / "state.json"
    start = 1
    with MatchStore(run_dir) as store:
        if state_path.exists():
            state = load_state(state_path)
            sched.load_state_dict(state["scheduler"])
            ratings.load_state_dict(state["ratings"])
            start = state["step"] + 1
            store.truncate_after(state["step"])
        else:
            sched.on_step(0, {"lm": 0})
        for step in range(start, steps + 1):
            results = [play(m, _strength, draw_scale=0.2) for m in sched.next_matches(per_step)]
            if step == kill_at:
                store.add(results[: per_step // 2], step)  # half the step is on disk, then...
                raise Killed
            store.add(results, step)
            sched.report(results)
            for r in results:
                ratings.update(r)
            sched.on_step(step, {"lm": step})  # one training step: version + 1
            if step % 3 == 0:
                save_state({"scheduler": sched.state_dict(), "ratings": ratings.state_dict(),
                            "step": step}, state_path)


def _records(run_dir: Path) -> list[tuple]:
    with MatchStore(run_dir) as store:
        return [(r.match.to_dict(), r.scores, r.length, r.invalid_moves, step)
                for r, step in store.results()]


def test_killed_and_resumed_tournament_has_the_same_records(tmp_path: Path) -> None:
    _run(tmp_path / "full", steps=12)
    with pytest.raises(Killed):
        _run(tmp_path / "resumed", steps=12, kill_at=8)  # last checkpoint: step 6
    with MatchStore(tmp_path / "resumed") as store:
        assert store.count() == 7 * 10 + 5  # steps 1-7 and half of step 8 reached the disk
    _run(tmp_path / "resumed", steps=12)

    full, resumed = _records(tmp_path / "full"), _records(tmp_path / "resumed")
    assert len(full) == 120
    assert len({r[0]["match_id"] for r in full}) == 120
    assert sorted(map(repr, resumed)) == sorted(map(repr, full))
    assert any(p["snapshot"] for r in full for p in r[0]["players"])  # snapshots were played


def test_rating_only_resume_skips_matches_already_stored(tmp_path: Path) -> None:
    sched = build_scheduler({"format": "round_robin", "rounds": 2}, ENTRANTS[1:] + [
        Entrant("lm")], ["ttt"], seed=1)
    matches = sched.next_matches(100)
    with MatchStore(tmp_path / "m.sqlite") as store:
        store.add([play(m, _strength) for m in matches[:5]], step=0)
        done = store.get(m.match_id for m in matches)
        todo = [m for m in matches if m.match_id not in done]
        assert len(done) == 5 and len(todo) == len(matches) - 5
        assert store.add([play(m, _strength) for m in matches], step=0) == len(todo)
        assert store.count() == len(matches)


def test_insert_is_idempotent_and_round_trips(tmp_path: Path) -> None:
    lm, snap, rnd = Player("lm", 4, learning=True), Player("lm", 2, snapshot=True), Player("random")
    results = [MatchResult(Match("m1", "ttt", (lm, rnd), round=3), (1.0, 0.0), 7, (0, 2),
                           {"reason": "win"}),
               MatchResult(Match("m2", "ttt", (snap, lm)), (0.5, 0.5), 9, (1, 0)),
               MatchResult(Match("m3", "kuhn", (rnd, lm)), (1.0, 0.0), 4, (0, 0))]
    with MatchStore(tmp_path) as store:
        assert store.add(results, step=5, now=1000.0) == 3
        assert store.add(results[:2], step=6) == 0  # a re-issued match is never counted twice
        assert store.count() == 3
        back = [r for r, _ in store.results()]
        assert back == results
        assert store.results(env="kuhn")[0][0] == results[2]
        assert {s for _, s in store.results()} == {5}
        stats = store.opponent_stats("lm")
        assert stats["random"] == pytest.approx({"games": 2, "win_rate": 0.5, "draw_rate": 0.0,
                                                 "loss_rate": 0.5, "score": 0.5,
                                                 "invalid_per_game": 0.0})
        assert stats["lm@2"]["draw_rate"] == 1.0
        seats = store.seat_stats()
        assert seats[0] == {"games": 3, "score": pytest.approx(2.5 / 3)}
        assert store.truncate_after(4) == 3 and store.count() == 0


def test_a_failing_batch_leaves_nothing_behind(tmp_path: Path) -> None:
    p, q = Player("a"), Player("b")
    good = MatchResult(Match("m1", "ttt", (p, q)), (1.0, 0.0))
    bad = MatchResult(Match("m2", "ttt", (p, q)), (1.0, 0.0), info={"x": object()})  # not JSON
    with MatchStore(tmp_path) as store:
        with pytest.raises(TypeError):
            store.add([good, bad], step=1)
        assert store.count() == 0
        assert store.add([good], step=1) == 1
    with MatchStore(tmp_path / MatchStore.FILENAME) as reopened:  # persisted on disk
        assert reopened.match_ids() == {"m1"}
