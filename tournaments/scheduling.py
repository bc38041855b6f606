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

Seats: a match has one player per seat of its env (``seat_names[env]``, the env's agents), and
an entrant's ``roles`` restrict the seats it may take. When every env has the same number of
seats and no entrant has roles, the envs are interchangeable: a format picks the players first,
each group of players cycles through the envs, and :class:`SeatBalancer` seats them (each player
takes each seat equally often per env and group; for two players: the first game at random,
then seat 0 to whoever had it less). Otherwise the env is picked first and only players allowed
in its seats are drawn (see each format).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from agentrt.core.registry import Registry
from agentrt.tournaments.seating import (
    SeatBalancer,
    feasible_groups,
    resolve_seats,
    seat_assignment,
)
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
        """Every pair of seats of one result counts as a game between their players, won by
        the higher score (pairwise decomposition; for two seats: one game). PFSP's estimate for
        a learner against B is thus its seat's score against B's seat; seats holding the same
        identity are skipped."""
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


@dataclass(frozen=True)
class Group:
    """The players of one match before it becomes a :class:`Match`.

    Attributes:
        players: One per seat; in seat order when ``seated``, else in any order.
        env: The env; None lets the group cycle through the envs (interchangeable envs only).
        seated: ``players`` are already in seat order (else :class:`SeatBalancer` seats them).
    """

    players: tuple[Player, ...]
    env: str | None = None
    seated: bool = False


class Scheduler(ABC):
    """Base of all match formats (see the module docstring for the driving loop).

    Subclasses implement :meth:`_next_groups`; groups are turned into matches here (match id,
    env, seats). The players' ``learning`` flags say whose turns the controller trains on.

    Args:
        entrants: Policies taking part; their ``roles`` restrict the seats they may take.
        envs: Env ids.
        seed: Seed of the scheduler's RNG.
        seats: Agent names in seat order per env id; envs not named here are looked up (see
            :func:`~agentrt.tournaments.seating.resolve_seats`).
    """

    name: ClassVar[str] = ""

    def __init__(self, entrants: Sequence[Entrant], envs: Sequence[str], seed: int = 0,
                 seats: Mapping[str, Sequence[str]] | None = None) -> None:
        if not envs:
            raise TournamentError("a tournament needs at least one env")
        ids = [e.policy_id for e in entrants]
        if len(set(ids)) != len(ids):
            raise TournamentError(f"entrants must have distinct policy ids; got {ids}")
        self.entrants = list(entrants)
        self._by_id = {e.policy_id: e for e in self.entrants}
        self.envs = list(envs)
        self.seat_names = resolve_seats(self.envs, seats)
        self._check_roles()
        self._allowed = {(e.policy_id, env): frozenset(
            i for i, agent in enumerate(names) if e.may_play(agent))
            for e in self.entrants for env, names in self.seat_names.items()}
        # Interchangeable envs: players are chosen first and cycle through the envs (the only
        # behaviour before seats and roles existed; two-seat configs keep their schedules).
        self.uniform = (len({len(n) for n in self.seat_names.values()}) == 1
                        and all(e.roles is None for e in self.entrants))
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.win_rates = WinRates()
        self.seats = SeatBalancer()
        self.versions: dict[str, int] = {e.policy_id: 0 for e in entrants}
        self.step = 0
        self.round = 0
        self._issued = 0
        self._pair_games: dict[str, int] = {}  # "a|b|.." -> games issued, rotates the env

    # ---- the interface -------------------------------------------------------------------
    def next_matches(self, n: int) -> list[Match]:
        """Up to ``n`` new matches; fewer (even none) when the format waits for results."""
        if n < 0:
            raise TournamentError(f"next_matches(n) needs n >= 0, got {n}")
        return [self._make_match(g) for g in self._next_groups(n)]

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

    def entrant(self, policy_id: str) -> Entrant:
        """The entrant of ``policy_id`` (a snapshot's is its learner's)."""
        if policy_id not in self._by_id:
            raise TournamentError(f"unknown policy {policy_id!r}; entrants: "
                                  f"{', '.join(e.policy_id for e in self.entrants)}")
        return self._by_id[policy_id]

    def current(self, policy_id: str, learning: bool | None = None) -> Player:
        """The live player of ``policy_id`` at its current version."""
        entrant = self.entrant(policy_id)
        learn = entrant.learning if learning is None else learning and entrant.learning
        return Player(policy_id, self.versions[policy_id], learning=learn)

    def allowed_seats(self, policy_id: str, env: str) -> frozenset[int]:
        """Seat indices of ``env`` that ``policy_id`` (or its snapshots) may take."""
        return self._allowed[(policy_id, env)]

    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable state; :meth:`load_state_dict` on a scheduler built from the same
        config, entrants, envs, seats and seed restores it exactly."""
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
    def _next_groups(self, n: int) -> list[Group]:
        """Up to ``n`` groups of players for the next matches."""

    def _make_match(self, group: Group) -> Match:
        players, env = group.players, group.env
        if env is None:
            tag = "|".join(sorted(p.key for p in players))
            count = self._pair_games.get(tag, 0)
            self._pair_games[tag] = count + 1
            env = self.envs[count % len(self.envs)]  # each group cycles through the envs
        if len(players) != len(self.seat_names[env]):
            raise TournamentError(f"{len(players)} players for the {len(self.seat_names[env])} "
                                  f"seats of env {env!r}")
        if not group.seated:
            allowed = [self.allowed_seats(p.policy_id, env) for p in players]
            players = self.seats.seat(env, players, allowed, self.rng)
        match = Match(f"m{self._issued:08d}", env, tuple(players), round=self.round)
        self._issued += 1
        return match

    def _choice(self, items: Sequence[Any], p: np.ndarray | None = None) -> Any:
        """One item, uniformly or with probabilities ``p`` (inverse CDF of one uniform draw)."""
        if p is None:
            return items[int(self.rng.integers(len(items)))]
        cdf = np.cumsum(p)
        i = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        return items[min(i, len(items) - 1)]

    def _group_envs(self) -> list[str | None]:
        """Envs the rating formats build groups for: one None (the groups cycle through the
        envs) when the envs are interchangeable, else every env."""
        return [None] if self.uniform else list(self.envs)

    def _seat_count(self, env: str | None) -> int:
        return len(self.seat_names[env if env is not None else self.envs[0]])

    def _eligible(self, env: str | None) -> list[str]:
        """Entrants that may take some seat of ``env`` (None: any env), in entrant order."""
        return [e.policy_id for e in self.entrants
                if env is None or self.allowed_seats(e.policy_id, env)]

    def _allowed_fn(self, env: str | None) -> Callable[[str], frozenset[int]]:
        every = frozenset(range(self._seat_count(env)))
        return (lambda pid: every) if env is None else (lambda pid: self._allowed[(pid, env)])

    def _require_fillable(self, fmt: str) -> None:
        """Every env's seats can be filled by distinct entrants (rating formats), and a game of
        two or more seats has two entrants at least."""
        if len(self.entrants) < 2 and max(map(len, self.seat_names.values())) > 1:
            raise TournamentError(f"{fmt} needs at least two entrants")
        for env, agents in self.seat_names.items():
            takers = [[i for i, e in enumerate(self.entrants) if e.may_play(a)] for a in agents]
            if seat_assignment(takers, len(self.entrants)) is not None:
                continue
            if len(self.entrants) < len(agents):
                raise TournamentError(f"{fmt} needs at least {len(agents)} entrants to fill the "
                                      f"{len(agents)} seats of env {env!r}")
            empty = [a for a, t in zip(agents, takers) if not t]
            why = (f"nobody may take {empty}" if empty
                   else "too few distinct entrants share the seats")
            raise TournamentError(f"{fmt}: the entrants' roles cannot fill the seats "
                                  f"{list(agents)} of env {env!r} ({why}); add those agents to "
                                  f"some entrant's roles or leave roles unset")

    def _check_roles(self) -> None:
        agents = sorted({a for names in self.seat_names.values() for a in names})
        for e in self.entrants:
            unknown = [r for r in e.roles or () if r not in agents]
            if unknown:
                raise TournamentError(
                    f"entrant {e.policy_id!r} has roles {unknown} that no env has; valid "
                    f"agent names of envs {self.envs}: {', '.join(agents)}")


MAX_ROUND_GROUPS = 20000  # above this many groups per round, round robin rotates instead


class RatedFormat(Scheduler):
    """A rating format: rounds of groups that fill every seat with distinct entrants."""

    def __init__(self, entrants: Sequence[Entrant], envs: Sequence[str], seed: int = 0,
                 rounds: int | None = None, games_per_pairing: int = 2,
                 seats: Mapping[str, Sequence[str]] | None = None) -> None:
        super().__init__(entrants, envs, seed, seats)
        self._require_fillable(self.name.replace("_", " "))
        self.rounds = rounds
        self.games_per_pairing = games_per_pairing
        self._queue: list[tuple[tuple[str, ...], str | None]] = []


class RoundRobin(RatedFormat):
    """Every group of entrants plays ``games_per_pairing`` games per round, rounds shuffled.

    Groups have one entrant per seat. With interchangeable envs (same seat count N, no roles)
    a round holds every N-combination of entrants (every pair for two-player games), each
    cycling through the envs; otherwise every combination that can fill env E's seats, for each
    env E. A round is shuffled with the scheduler's RNG, and :class:`SeatBalancer` rotates each
    group's seats from game to game (so ``games_per_pairing`` = N plays every seat once when
    the roles allow it). When a round would hold more than :data:`MAX_ROUND_GROUPS` groups
    (e.g. 3 seats and 50 entrants), each round is a seeded rotation instead: the entrants in a
    random order, each still unplaced one forming a group with the next unplaced ones it can be
    seated with, so every entrant plays at least once per round.

    Args:
        rounds: Number of rounds; None repeats forever (the controller's budget stops it).
        games_per_pairing: Games per group per round; 2 plays both seat orders of a pair.
    """

    name = "round_robin"

    @property
    def done(self) -> bool:
        return not self._queue and self.rounds is not None and self.round >= self.rounds

    def _next_groups(self, n: int) -> list[Group]:
        out: list[Group] = []
        while len(out) < n:
            if not self._queue:
                if self.rounds is not None and self.round >= self.rounds:
                    break
                self._refill()
            ids, env = self._queue.pop(0)
            out.append(Group(tuple(self.current(i) for i in ids), env))
        return out

    def _refill(self) -> None:
        items = [(g, env) for env in self._group_envs() for g in self._round_groups(env)]
        order = self.rng.permutation(len(items))
        self._queue = [items[i] for i in order for _ in range(self.games_per_pairing)]
        self.round += 1

    def _round_groups(self, env: str | None) -> list[tuple[str, ...]]:
        ids, n, allowed = self._eligible(env), self._seat_count(env), self._allowed_fn(env)
        if math.comb(len(ids), n) <= MAX_ROUND_GROUPS:
            return list(feasible_groups(None, ids, n, allowed, limit=None))
        order = [ids[i] for i in self.rng.permutation(len(ids))]
        placed: set[str] = set()
        groups = []
        for a in order:
            if a in placed:
                continue
            pool = [x for x in order if x not in placed and x != a] + \
                [x for x in order if x in placed]
            group = next(feasible_groups(a, pool, n, allowed), None)
            if group is not None:
                placed.update(group)
                groups.append(group)
        return groups

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "queue": [[list(g), env] for g, env in self._queue]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._queue = load_queue(state["queue"])


def load_queue(saved: list[list[Any]]) -> list[tuple[tuple[str, ...], str | None]]:
    """Saved queue entries ``[ids, env]`` (or ``[a, b]`` as saved by two-seat versions)."""
    return [(tuple(q), None) if all(isinstance(x, str) for x in q) else (tuple(q[0]), q[1])
            for q in saved]


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
