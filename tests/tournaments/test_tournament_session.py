"""The Tournament object the controller holds: a training run killed and resumed, a rating-only
run resumed without replaying, and results recorded twice, all end where an uninterrupted run
ends (same records, same ratings)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tournament_sim import play

from agentrt.tournaments.scheduling import load_state, save_state
from agentrt.tournaments.session import Tournament
from agentrt.tournaments.types import Entrant, Player, TournamentError

LEAGUE = [Entrant("lm", True, "main"), Entrant("mx", True, "main_exploiter"),
          Entrant("random"), Entrant("heuristic")]
SCHEDULE = {"format": "league", "snapshot": {"every": 3, "min_steps": 1}}


def _strength(p: Player) -> float:
    return {"random": -1.0, "heuristic": 0.3}.get(p.policy_id, -1.0 + 0.2 * p.version)


class Killed(Exception):
    """Stands in for the process dying."""


def _train(run_dir: Path, steps: int, kill_at: int | None = None) -> Tournament:
    """A league training run with a checkpoint every 2 steps; resumes when one exists."""
    ckpt = run_dir / "ckpt.json"
    t = Tournament(run_dir, SCHEDULE, LEAGUE, ["ttt", "kuhn"], seed=3)
    if ckpt.exists():
        t.load_state_dict(load_state(ckpt)["tournament"])
    else:
        t.on_step(0, {"lm": 0, "mx": 0})
    for step in range(t.step + 1, steps + 1):
        results = [play(m, _strength, draw_scale=0.2) for m in t.next_matches(12)]
        if step == kill_at:
            t.record(results[:5], step)  # part of the step reached the disk, then the crash
            raise Killed
        t.record(results, step)
        t.on_step(step, {"lm": step, "mx": step})
        if step % 2 == 0:
            save_state({"tournament": t.state_dict()}, ckpt)
    return t


def _summary(t: Tournament) -> tuple:
    records = sorted(repr((r.match.to_dict(), r.scores, s)) for r, s in t.store.results())
    return records, t.leaderboard(), t.elo.leaderboard("kuhn"), t.games


def test_training_run_killed_and_resumed_matches_uninterrupted(tmp_path: Path) -> None:
    with _train(tmp_path / "a", steps=9) as full:
        expected = _summary(full)
    with pytest.raises(Killed):
        _train(tmp_path / "b", steps=9, kill_at=7)
    with _train(tmp_path / "b", steps=9) as resumed:
        assert _summary(resumed) == expected
    assert len(expected[0]) == 9 * 12 and expected[3] == 9 * 12


def test_rating_only_run_resumes_without_replaying(tmp_path: Path) -> None:
    entrants = [Entrant(n) for n in ("ckpt100", "ckpt200", "ckpt300", "random")]
    strength = {"ckpt100": 0.0, "ckpt200": 0.5, "ckpt300": 1.0, "random": -1.0}
    cfg = {"format": "round_robin", "rounds": 4}

    def run(path: Path, stop_after: int | None = None) -> tuple[Tournament, int]:
        t = Tournament(path, cfg, entrants, ["ttt"], seed=1)
        if (path / "state.json").exists():
            t.load_state_dict(load_state(path / "state.json"), replay=False)
        played = 0
        while not t.done:
            matches = t.next_matches(5)
            stored = t.stored(matches)
            new = [play(m, lambda p: strength[p.key]) for m in matches if m.match_id not in stored]
            played += len(new)
            t.record(new + list(stored.values()), t.step + 1)
            if t.step == 2:
                save_state(t.state_dict(), path / "state.json")
            if t.step == stop_after:
                break
        return t, played

    full, played_full = run(tmp_path / "full")
    t, first = run(tmp_path / "split", stop_after=4)  # killed after step 4; checkpoint at 2
    t.close()
    resumed, second = run(tmp_path / "split")
    assert first + second == played_full == 6 * 2 * 4  # no match was played twice
    assert _summary(resumed) == _summary(full)
    full.close()
    resumed.close()


def test_recording_the_same_results_twice_changes_nothing(tmp_path: Path) -> None:
    with Tournament(tmp_path, {"format": "pfsp"}, LEAGUE[:1] + LEAGUE[2:], ["ttt"]) as t:
        t.on_step(0, {"lm": 0})
        results = [play(m, _strength) for m in t.next_matches(20)]
        assert t.record(results, 1) == 20
        before = (t.leaderboard(), t.scheduler.win_rates.state_dict(), t.games)
        assert t.record(results, 1) == 0
        assert (t.leaderboard(), t.scheduler.win_rates.state_dict(), t.games) == before
        line = t.progress_line()
        assert line.startswith("step 1 | games 20 | lm vs heuristic ") and "top: " in line
        assert t.write_report().is_file()
        with pytest.raises(TournamentError, match="scheduler"):
            t.load_state_dict({"step": 3})
