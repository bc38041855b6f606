"""One object per tournament run: scheduler + ratings + match records + report, resumable.

:class:`Tournament` is what the controller (``agentrt tournament run/eval``) holds. It keeps the
scheduler, the online ratings and the record store consistent with each other, which is the
part that is easy to get wrong on resume::

    t = Tournament(run_dir, schedule_cfg, entrants, envs=["tictactoe"], seed=cfg.seed)
    if checkpoint: t.load_state_dict(checkpoint["tournament"])      # resume (see below)
    else: t.on_step(0, versions)
    for step in range(t.step + 1, steps + 1):
        matches = t.next_matches(n)
        results = runner.play(matches)          # trajectories of learning seats are trained on
        t.record(results, step)
        ...train; bump versions...
        for ev in t.on_step(step, versions):    # freeze snapshots the scheduler asked for
            save_snapshot(ev.player); reset_if(ev.reset); free(ev.dropped)
        print(t.progress_line()); checkpoint["tournament"] = t.state_dict()
    t.write_report()

Resume: ``load_state_dict`` restores scheduler and ratings at the checkpoint's step and, by
default, deletes records of later steps (``replay=True``: a training run plays those matches
again because it needs their trajectories). A rating-only run passes ``replay=False``, keeps
them, and avoids replaying with :meth:`Tournament.stored`; :meth:`Tournament.record` then feeds
the stored outcomes to the ratings without storing them twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from agentrt.tournaments.config import ScheduleConfig, build_scheduler
from agentrt.tournaments.ratings import ALL, EloRatings, OpenSkillRatings, RatingRow
from agentrt.tournaments.records import MatchStore
from agentrt.tournaments.report import write_report
from agentrt.tournaments.types import Entrant, Match, MatchResult, SnapshotEvent, TournamentError


class Tournament:
    """Scheduler, ratings (OpenSkill and Elo, per env and pooled) and records of one run.

    Args:
        run_dir: Run folder; records go to ``<run_dir>/matches.sqlite``.
        schedule: The ``schedule`` config section (or a dict of it).
        entrants: Policies taking part (``learning`` marks the ones the run trains).
        envs: Env names the matches are played in.
        seed: Scheduler seed.
        rating_model: OpenSkill model name (see ``ratings.OPENSKILL_MODELS``).
        seats: Agent names in seat order per env id; envs left out are read from the env
            registry (``make_multi(env_id).possible_agents``). Matches have one player per
            seat; ``Entrant.roles`` pin entrants to some of them.
    """

    def __init__(self, run_dir: str | Path, schedule: ScheduleConfig | dict[str, Any],
                 entrants: Sequence[Entrant], envs: Sequence[str], seed: int = 0,
                 rating_model: str = "plackett_luce",
                 seats: Mapping[str, Sequence[str]] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.scheduler = build_scheduler(schedule, entrants, envs, seed, seats)
        self.ratings = OpenSkillRatings(rating_model)
        self.elo = EloRatings()
        self._store: MatchStore | None = None  # opened on first use: a resume that finds no
        self.step = 0                           # good checkpoint leaves the database untouched
        self.games = 0
        self._rated_through = -1  # stored matches of steps <= this are already in the ratings
        self._fed: set[str] = set()  # match ids fed to the ratings since then

    @property
    def store(self) -> MatchStore:
        if self._store is None:
            self._store = MatchStore(self.run_dir)
        return self._store

    # ---- the loop ------------------------------------------------------------------------
    def next_matches(self, n: int) -> list[Match]:
        """Up to ``n`` matches from the scheduler (fewer when it waits for results)."""
        return self.scheduler.next_matches(n)

    def stored(self, matches: Sequence[Match]) -> dict[str, MatchResult]:
        """Results already on disk for these matches (skip playing them in rating-only runs)."""
        return self.store.get(m.match_id for m in matches)

    def record(self, results: Sequence[MatchResult], step: int) -> int:
        """Stores new results and feeds each match exactly once to the scheduler and ratings.

        A match already stored is not stored again; its stored outcome (the record of truth) is
        fed to the ratings unless they already contain it (recorded at or before the restored
        checkpoint, or fed earlier in this process). Calling ``record`` twice with the same
        results therefore changes nothing the second time.

        Returns:
            How many results were new to the store.
        """
        known = self.store.get(r.match.match_id for r in results)
        known_steps = self.store.steps_of(known)
        added = self.store.add([r for r in results if r.match.match_id not in known], step)
        feed = []
        for r in results:
            mid = r.match.match_id
            already_rated = mid in known and known_steps[mid] <= self._rated_through
            if mid in self._fed or already_rated:
                continue
            self._fed.add(mid)
            feed.append(known.get(mid, r))
        self.scheduler.report(feed)
        for r in feed:
            self.ratings.update(r)
            self.elo.update(r)
        self.games += len(feed)
        self.step = max(self.step, step)
        return added

    def on_step(self, step: int, versions: Mapping[str, int]) -> list[SnapshotEvent]:
        """After a training step: new versions in, snapshots to materialize out."""
        self.step = step
        return self.scheduler.on_step(step, versions)

    @property
    def done(self) -> bool:
        return self.scheduler.done

    # ---- views ---------------------------------------------------------------------------
    def leaderboard(self, env: str = ALL) -> list[RatingRow]:
        """Online OpenSkill leaderboard, by conservative rating mu - 3 sigma."""
        return self.ratings.leaderboard(env)

    def progress_line(self, window: int = 10, top: int = 3) -> str:
        """One terminal line: step, games, learners' recent score per opponent, leaders."""
        since = max(0, self.step - window + 1)
        parts = [f"step {self.step}", f"games {self.games}"]
        learners = [e.policy_id for e in self.scheduler.entrants if e.learning]
        for pid in learners:
            stats = self.store.opponent_stats(pid, since_step=since)
            fixed = {k: v for k, v in stats.items() if "@" not in k}
            if fixed:
                shown = " ".join(f"{k} {v['score']:.2f}" for k, v in sorted(fixed.items()))
                parts.append(f"{pid} vs {shown}")
        leaders = ", ".join(f"{r.key} {r.rating:.1f}" for r in self.leaderboard()[:top])
        parts.append(f"top: {leaders or '-'}")
        return " | ".join(parts)

    def write_report(self, out: str | Path | None = None, title: str = "agentrt tournament"
                     ) -> Path:
        """Writes ``report.html`` (or ``out``) from the records; returns its path."""
        return write_report(self.store, out, title=title)

    # ---- checkpoint ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable state at the current step (records live in SQLite already)."""
        return {"step": self.step, "games": self.games,
                "scheduler": self.scheduler.state_dict(),
                "ratings": self.ratings.state_dict(), "elo": self.elo.state_dict()}

    def load_state_dict(self, state: dict[str, Any], replay: bool = True) -> None:
        """Restores a checkpoint; ``replay`` deletes records after its step (training runs)."""
        if "scheduler" not in state:
            raise TournamentError("tournament state has no 'scheduler'; was it saved by "
                                  "Tournament.state_dict()?")
        self.scheduler.load_state_dict(state["scheduler"])
        self.ratings.load_state_dict(state["ratings"])
        self.elo.load_state_dict(state["elo"])
        self.step, self.games = int(state["step"]), int(state["games"])
        self._rated_through, self._fed = self.step, set()
        if replay:
            self.store.truncate_after(self.step)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> Tournament:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
