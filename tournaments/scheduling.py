"""Match-making: the scheduler interface, its shared parts, round robin and swiss.

Every format is a :class:`Scheduler` with one interface, driven by the controller like this::

    sched = build_scheduler(cfg, entrants, envs=["tictactoe"], seed=0)
    sched.on_step(0, versions)                  # before the first matches: initial versions
    while not sched.done:
        matches = sched.next_matches(64)        # may be fewer than 64 (swiss waits for results)
        results = play(matches)                 # episode runner -> list[MatchResult]
        sched.report(results)                   # win rates, swiss scores
        ...train learners...
        for ev in sched.on_step(step, versions):  # new frozen snapshots to materialize
            save_snapshot(ev.player, reset=ev.reset)
        checkpoint(sched.state_dict())

Everything is deterministic given the seed and the sequence of calls: the scheduler owns its
numpy ``Generator`` and serializes it in :meth:`Scheduler.state_dict`, so a resumed run issues the
same match ids, players and seats as an uninterrupted one.

Seats: two-player matches are seated by :class:`SeatBalancer`, per (env, pair of players): the
first game of a pair is seated at random and every later game gives seat 0 to whoever has had it
less, so over time each player sits in each seat equally often against each opponent.
"""

from __future__ import annotations

import json
import os
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from agentrt.registry import Registry
from agentrt.tournaments.types import (
    Entrant,
    Match,
    MatchResult,
    Player,
    SnapshotEvent,
    TournamentError,
)

# --------------------------------------------------------------------------------------------
# PFSP weightings (AlphaStar, Vinyals et al. 2019, Nature 575; "Methods: prioritized fictitious
# self-play"): opponent B is sampled for learner A with probability f(P[A beats B]) / sum f.
# --------------------------------------------------------------------------------------------
PFSP_WEIGHTINGS: Registry[Callable[[np.ndarray, float], np.ndarray]] = Registry("pfsp weighting")
PFSP_WEIGHTINGS.add("hard", lambda x, p: (1.0 - x) ** p)  # f_hard(x) = (1 - x)^p, focuses on losses
PFSP_WEIGHTINGS.add("variance", lambda x, p: x * (1.0 - x))  # f_var(x) = x(1 - x), even matches
PFSP_WEIGHTINGS.add("linear", lambda x, p: 1.0 - x)
PFSP_WEIGHTINGS.add("linear_capped", lambda x, p: np.minimum(0.5, 1.0 - x))  # league exploiters


def pfsp_probs(win_rates: Sequence[float], weighting: str = "hard", exponent: float = 2.0
               ) -> np.ndarray:
    """Sampling probabilities of PFSP opponents.

    Args:
        win_rates: [K] estimated probability that the learner beats each candidate (draws 0.5).
        weighting: Name in :data:`PFSP_WEIGHTINGS` ("hard", "variance", "linear", "linear_capped").
        exponent: p of the hard weighting (1 - x)^p; AlphaStar's "squared" is p = 2.

    Returns:
        [K] probabilities summing to 1; uniform when every weight is ~0 (as in AlphaStar's
        pseudocode), e.g. the learner beats every candidate surely.
    """
    x = np.clip(np.asarray(win_rates, dtype=np.float64), 0.0, 1.0)
    if x.size == 0:
        raise TournamentError("PFSP needs at least one candidate opponent")
    w = PFSP_WEIGHTINGS.get(weighting)(x, exponent)
    total = float(w.sum())
    if total < 1e-10:
        return np.full(x.size, 1.0 / x.size)
    return w / total


class WinRates:
    """Decayed pairwise payoff: P[a beats b] estimated from recent results (draws count half).

    Each update first multiplies the pair's counts by ``decay`` (AlphaStar's payoff uses 0.99), so
    a learner's estimate follows its current strength. With no games the rate is ``prior`` (0.5).
    """

    def __init__(self, decay: float = 0.99, prior: float = 0.5) -> None:
        self.decay = decay
        self.prior = prior
        self._games: dict[tuple[str, str], float] = {}
        self._score: dict[tuple[str, str], float] = {}

    def update(self, a: str, b: str, score_a: float) -> None:
        """Records one game of ``a`` against ``b`` with ``score_a`` in [0, 1] (draw 0.5)."""
        if a == b:
            return
        for key, s in (((a, b), score_a), ((b, a), 1.0 - score_a)):
            self._games[key] = self._games.get(key, 0.0) * self.decay + 1.0
            self._score[key] = self._score.get(key, 0.0) * self.decay + s

    def update_from(self, result: MatchResult) -> None:
        """All pairs of seats of one result (for two seats: one update)."""
        keys, scores = result.match.keys, result.scores
        for i in range(len(keys)):
            for j in range(i + 1, len(keys)):
                s = 1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0
                self.update(keys[i], keys[j], s)

    def rate(self, a: str, b: str) -> float:
        games = self._games.get((a, b), 0.0)
        return self._score[(a, b)] / games if games > 0 else self.prior

    def rates(self, a: str, opponents: Sequence[str]) -> np.ndarray:
        return np.array([self.rate(a, b) for b in opponents], dtype=np.float64)

    def games(self, a: str, b: str) -> float:
        return self._games.get((a, b), 0.0)

    def forget(self, key: str) -> None:
        """Drops every entry involving ``key`` (a learner reset to its initial weights)."""
        for d in (self._games, self._score):
            for pair in [p for p in d if key in p]:
                del d[pair]

    def state_dict(self) -> dict[str, Any]:
        rows = [[a, b, g, self._score[(a, b)]] for (a, b), g in sorted(self._games.items())]
        return {"decay": self.decay, "prior": self.prior, "rows": rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decay, self.prior = state["decay"], state["prior"]
        self._games = {(a, b): g for a, b, g, _ in state["rows"]}
        self._score = {(a, b): s for a, b, _, s in state["rows"]}


class SeatBalancer:
    """Seats pairs so each player takes each seat equally often per (env, opponent)."""

    def __init__(self) -> None:
        self._lead: dict[str, int] = {}  # "env|a|b" (a < b) -> times a had seat 0 minus b had it

    def seat(self, env: str, a: Player, b: Player, rng: np.random.Generator) -> tuple[Player, ...]:
        """Returns ``(seat0, seat1)``: random on a tie, else the player who had seat 0 less."""
        if a.key == b.key:
            return (a, b)
        first, second = (a, b) if a.key < b.key else (b, a)
        tag = f"{env}|{first.key}|{second.key}"
        lead = self._lead.get(tag, 0)
        first_goes_first = bool(rng.integers(2)) if lead == 0 else lead < 0
        self._lead[tag] = lead + (1 if first_goes_first else -1)
        return (first, second) if first_goes_first else (second, first)

    def state_dict(self) -> dict[str, Any]:
        return dict(self._lead)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._lead = {k: int(v) for k, v in state.items()}


class Scheduler(ABC):
    """Base of all match formats (see the module docstring for the driving loop).

    Subclasses implement :meth:`_next_pairs`; pairs are turned into matches here (match id, env,
    seats). A pair is ``(a, b)``: two :class:`Player` objects whose ``learning`` flags say whose
    turns the controller trains on in that match.
    """

    name: ClassVar[str] = ""

    def __init__(self, entrants: Sequence[Entrant], envs: Sequence[str], seed: int = 0) -> None:
        if not envs:
            raise TournamentError("a tournament needs at least one env")
        ids = [e.policy_id for e in entrants]
        if len(set(ids)) != len(ids):
            raise TournamentError(f"entrants must have distinct policy ids; got {ids}")
        self.entrants = list(entrants)
        self.envs = list(envs)
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.win_rates = WinRates()
        self.seats = SeatBalancer()
        self.versions: dict[str, int] = {e.policy_id: 0 for e in entrants}
        self.step = 0
        self.round = 0
        self._issued = 0
        self._pair_games: dict[str, int] = {}  # "a|b" -> games issued, rotates the env per pair

    # ---- the interface -------------------------------------------------------------------
    def next_matches(self, n: int) -> list[Match]:
        """Up to ``n`` new matches; fewer (even none) when the format waits for results."""
        if n < 0:
            raise TournamentError(f"next_matches(n) needs n >= 0, got {n}")
        return [self._make_match(a, b) for a, b in self._next_pairs(n)]

    def report(self, results: Sequence[MatchResult]) -> None:
        """Feeds outcomes back (win-rate estimates, swiss standings). Call once per result."""
        for r in results:
            self.win_rates.update_from(r)

    def on_step(self, step: int, versions: Mapping[str, int]) -> list[SnapshotEvent]:
        """Tells the scheduler the training step and each learner's weight version.

        Returns:
            Snapshot events the controller must materialize before the next
            :meth:`next_matches`; always empty for the rating formats.
        """
        self.step = step
        self.versions.update({k: int(v) for k, v in versions.items() if k in self.versions})
        return []

    @property
    def done(self) -> bool:
        """True when the format has no more matches to issue (finite round robin, swiss)."""
        return False

    def population(self) -> list[Player]:
        """Everyone who can currently be scheduled (learners, snapshots, fixed opponents)."""
        return [self.current(e.policy_id) for e in self.entrants]

    def current(self, policy_id: str, learning: bool | None = None) -> Player:
        """The live player of ``policy_id`` at its current version."""
        entrant = next((e for e in self.entrants if e.policy_id == policy_id), None)
        if entrant is None:
            raise TournamentError(f"unknown policy {policy_id!r}; entrants: "
                                  f"{', '.join(e.policy_id for e in self.entrants)}")
        learn = entrant.learning if learning is None else learning and entrant.learning
        return Player(policy_id, self.versions[policy_id], learning=learn)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable state; :meth:`load_state_dict` on a scheduler built from the same
        config, entrants, envs and seed restores it exactly."""
        return {
            "format": self.name, "rng": self.rng.bit_generator.state,
            "win_rates": self.win_rates.state_dict(), "seats": self.seats.state_dict(),
            "versions": dict(self.versions), "step": self.step, "round": self.round,
            "issued": self._issued, "pair_games": dict(self._pair_games),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != self.name:
            raise TournamentError(
                f"saved scheduler state is for format {state.get('format')!r}, not {self.name!r}"
            )
        self.rng.bit_generator.state = state["rng"]
        self.win_rates.load_state_dict(state["win_rates"])
        self.seats.load_state_dict(state["seats"])
        self.versions = {k: int(v) for k, v in state["versions"].items()}
        self.step, self.round, self._issued = state["step"], state["round"], state["issued"]
        self._pair_games = {k: int(v) for k, v in state["pair_games"].items()}

    # ---- helpers for subclasses ----------------------------------------------------------
    @abstractmethod
    def _next_pairs(self, n: int) -> list[tuple[Player, Player]]:
        """Up to ``n`` pairs of players for the next matches."""

    def _make_match(self, a: Player, b: Player) -> Match:
        tag = "|".join(sorted((a.key, b.key)))
        count = self._pair_games.get(tag, 0)
        self._pair_games[tag] = count + 1
        env = self.envs[count % len(self.envs)]  # each pair cycles through the envs
        players = self.seats.seat(env, a, b, self.rng)
        match = Match(f"m{self._issued:08d}", env, players, round=self.round)
        self._issued += 1
        return match

    def _choice(self, items: Sequence[Any], p: np.ndarray | None = None) -> Any:
        """One item, uniformly or with probabilities ``p`` (inverse CDF of one uniform draw)."""
        if p is None:
            return items[int(self.rng.integers(len(items)))]
        cdf = np.cumsum(p)
        i = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        return items[min(i, len(items) - 1)]


class RoundRobin(Scheduler):
    """Every pair of entrants plays ``games_per_pairing`` games per round, rounds shuffled.

    Args:
        rounds: Number of rounds; None repeats forever (the controller's budget stops it).
        games_per_pairing: Games per pair per round; 2 plays both seat orders.
    """

    name = "round_robin"

    def __init__(self, entrants: Sequence[Entrant], envs: Sequence[str], seed: int = 0,
                 rounds: int | None = None, games_per_pairing: int = 2) -> None:
        super().__init__(entrants, envs, seed)
        if len(entrants) < 2:
            raise TournamentError("round robin needs at least two entrants")
        self.rounds = rounds
        self.games_per_pairing = games_per_pairing
        self._queue: list[tuple[str, str]] = []

    @property
    def done(self) -> bool:
        return not self._queue and self.rounds is not None and self.round >= self.rounds

    def _next_pairs(self, n: int) -> list[tuple[Player, Player]]:
        out: list[tuple[Player, Player]] = []
        while len(out) < n:
            if not self._queue:
                if self.rounds is not None and self.round >= self.rounds:
                    break
                self._refill()
            a, b = self._queue.pop(0)
            out.append((self.current(a), self.current(b)))
        return out

    def _refill(self) -> None:
        ids = [e.policy_id for e in self.entrants]
        pairs = [(a, b) for i, a in enumerate(ids) for b in ids[i + 1:]]
        order = self.rng.permutation(len(pairs))
        self._queue = [pairs[i] for i in order for _ in range(self.games_per_pairing)]
        self.round += 1

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "queue": [list(p) for p in self._queue]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._queue = [(a, b) for a, b in state["queue"]]


def save_state(state: dict[str, Any], path: str | Path) -> None:
    """Writes a JSON state atomically (temp file + rename): a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_state(path: str | Path) -> dict[str, Any]:
    """Reads a state written by :func:`save_state`."""
    path = Path(path)
    if not path.is_file():
        raise TournamentError(f"no saved tournament state at {str(path)!r}")
    return json.loads(path.read_text())
