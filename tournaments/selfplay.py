"""Self-play formats: mirror, lagged, uniform fictitious self-play (FSP), PFSP and exploit.

All four cycle through the learning entrants (one match per learner in turn) and pick an opponent:

- ``mirror``: the learner against its current self; both seats are trained on.
- ``lagged``: against its own snapshot from ``lag`` versions ago (a snapshot is taken at every
  step; the pool keeps the last ``lag + 1``).
- ``fsp``: uniformly over the pool (fictitious self-play, Heinrich et al. 2015: a best response
  to the average of past strategies).
- ``pfsp``: over the pool with probability ∝ f(P[learner beats opponent]) (AlphaStar).
- ``exploit``: only the fixed entrants, uniformly (an exploiter of frozen policies).

The pool holds frozen snapshots of every learner plus the fixed entrants (scripted baselines,
checkpoints); a snapshot may take the seats its learner's ``roles`` allow. Version 0 of each
learner, the weights the run started with, is in the pool from the start; the controller must be
able to load it. Later snapshots are taken by
:class:`SnapshotRule` in :meth:`SelfPlayScheduler.on_step` and returned as
:class:`SnapshotEvent`s that the controller materializes (e.g. saves the LoRA adapter).

Seats: a match has one player per seat of its env. With interchangeable envs (same seat count,
no roles) the learner's match draws one opponent per other seat, independently, then the group
cycles through the envs and :class:`~agentrt.tournaments.seating.SeatBalancer` seats it. With
roles or envs of different sizes the learner cycles through the envs it can play; it takes the
seat it has had least there (among its roles' seats whose other seats someone may take) and each
other seat's opponent is drawn, independently, among the players allowed in that seat. A
one-seat env has the learner play alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from agentrt.tournaments.scheduling import Group, Scheduler, pfsp_probs
from agentrt.tournaments.types import Entrant, Player, SnapshotEvent, TournamentError


@dataclass(frozen=True)
class SnapshotRule:
    """When a learner is frozen into the pool.

    Attributes:
        every: Snapshot after this many steps since the last one (None: only by win rate).
        win_rate: Snapshot early when the learner's lowest win rate against its reference
            opponents exceeds this (AlphaStar uses 0.7); None disables.
        min_steps: Never snapshot sooner than this many steps after the last one.
        max_pool: Snapshots kept per learner; the oldest are dropped (None keeps all).
    """

    every: int | None = 20
    win_rate: float | None = 0.7
    min_steps: int = 5
    max_pool: int | None = None

    def ready(self, steps_since: int, min_win_rate: float | None) -> bool:
        if steps_since < self.min_steps:
            return False
        if self.every is not None and steps_since >= self.every:
            return True
        return (self.win_rate is not None and min_win_rate is not None
                and min_win_rate > self.win_rate)


class SelfPlayScheduler(Scheduler):
    """Shared parts of the self-play formats: learners, the snapshot pool, the snapshot rule."""

    uses_fixed: bool = True

    def __init__(self, entrants: Sequence[Entrant], envs: Sequence[str], seed: int = 0,
                 snapshot: SnapshotRule | None = None, win_rate_decay: float = 0.99,
                 seats: Mapping[str, Sequence[str]] | None = None) -> None:
        super().__init__(entrants, envs, seed, seats)
        self.learners = [e.policy_id for e in entrants if e.learning]
        self.fixed = [e.policy_id for e in entrants if not e.learning]
        if not self.learners:
            raise TournamentError(f"format {self.name!r} needs at least one learning policy")
        if self.fixed and not self.uses_fixed:
            raise TournamentError(
                f"format {self.name!r} only plays learners against themselves; use 'pfsp', 'fsp' "
                f"or 'league' to include fixed opponents {self.fixed}"
            )
        self.rule = snapshot or SnapshotRule()
        self.win_rates.decay = win_rate_decay
        self.pool: dict[str, list[int]] = {pid: [0] for pid in self.learners}
        self.last_snapshot: dict[str, int] = {pid: 0 for pid in self.learners}
        self._turn = 0
        self._env_turn = {pid: 0 for pid in self.learners}
        self._plays = {pid: self._playable_seats(pid) for pid in self.learners}
        self._faced = {pid: {self.seat_names[env][j] for env, own in plays.items() for s in own
                             for j in range(len(self.seat_names[env])) if j != s}
                       for pid, plays in self._plays.items()}

    # ---- pool ----------------------------------------------------------------------------
    def may_sit(self, policy_id: str, agent: str | None) -> bool:
        """Whether ``policy_id`` (or its snapshots) may take the seat of ``agent`` (None: any)."""
        return agent is None or self.entrant(policy_id).may_play(agent)

    def snapshots(self, of: str | None = None, agent: str | None = None) -> list[Player]:
        """Frozen snapshots in the pool, of one learner or of all, oldest first; only those
        allowed in the seat of ``agent`` when given."""
        ids = [of] if of is not None else self.learners
        return [Player(pid, v, snapshot=True) for pid in ids if self.may_sit(pid, agent)
                for v in self.pool[pid]]

    def fixed_players(self, agent: str | None = None) -> list[Player]:
        return [Player(pid, self.versions[pid]) for pid in self.fixed if self.may_sit(pid, agent)]

    def candidates(self, agent: str | None = None) -> list[Player]:
        """The opponent pool: every snapshot plus the fixed entrants (those allowed in the seat
        of ``agent`` when given)."""
        return self.snapshots(agent=agent) + self.fixed_players(agent)

    def population(self) -> list[Player]:
        return [self.current(pid) for pid in self.learners] + self.candidates()

    def meta_strategy(self, policy_id: str) -> dict[str, float]:
        """The average of ``policy_id``'s frozen iterates: the uniform mixture of its snapshots
        in the pool (the last ``snapshot.max_pool``). In two-player zero-sum games the average of
        no-regret self-play converges to a Nash equilibrium where the last iterate may cycle;
        for ``fsp`` it is fictitious play's average policy. A run with
        ``eval.exploitability: auto`` reports its exact NashConv beside the latest policy's."""
        own = self.snapshots(policy_id)
        return {p.key: 1.0 / len(own) for p in own}

    # ---- scheduling ----------------------------------------------------------------------
    def _next_groups(self, n: int) -> list[Group]:
        groups = []
        for _ in range(n):
            learner = self.learners[self._turn % len(self.learners)]
            self._turn += 1
            groups.append(self._group_for(learner))
        self.round = self.step
        return groups

    def _group_for(self, learner: str) -> Group:
        me = self.current(learner, learning=True)
        if self.uniform:
            others = [self._opponent(learner, None) for _ in range(self._seat_count(None) - 1)]
            return Group((me, *others))
        envs = list(self._plays[learner])
        env = envs[self._env_turn[learner] % len(envs)]
        self._env_turn[learner] += 1
        agents = self.seat_names[env]
        seat = self.seats.pick_seat(env, me.key, self._plays[learner][env], len(agents), self.rng)
        players = [me if j == seat else self._opponent(learner, a) for j, a in enumerate(agents)]
        return Group(tuple(players), env, seated=True)

    def _opponent(self, learner: str, agent: str | None) -> Player:
        """An opponent of ``learner`` for the seat of ``agent`` (None: any seat)."""
        raise NotImplementedError

    def _can_fill(self, learner: str, agent: str) -> bool:
        """Whether the format finds an opponent of ``learner`` for the seat of ``agent``
        (default: some snapshot or fixed entrant may sit there)."""
        return any(e.may_play(agent) for e in self.entrants)

    def _playable_seats(self, learner: str) -> dict[str, list[int]]:
        """env -> seats ``learner`` may take whose other seats the format can fill."""
        out, why = {}, []
        for env, agents in self.seat_names.items():
            own = sorted(self.allowed_seats(learner, env))
            empty = sorted({a for j, a in enumerate(agents) if not self._can_fill(learner, a)})
            ok = [s for s in own if not set(empty) - {agents[s]}]
            if ok:
                out[env] = ok
            elif not own:
                why.append(f"its roles are no seat of {env}")
            else:
                why.append(f"no opponent may take {empty} in {env}")
        if not out:
            raise TournamentError(
                f"format {self.name!r}: learner {learner!r} can play no env ({'; '.join(why)}); "
                f"widen its roles, or give a policy or baseline the missing roles")
        return out

    def _faces(self, learner: str, policy_id: str) -> bool:
        """Whether ``policy_id`` can ever sit opposite ``learner``."""
        return any(self.may_sit(policy_id, a) for a in self._faced[learner])

    def on_step(self, step: int, versions: Mapping[str, int]) -> list[SnapshotEvent]:
        super().on_step(step, versions)
        events = []
        for pid in self.learners:
            if self.rule.ready(step - self.last_snapshot[pid], self._gate_rate(pid)):
                event = self._take_snapshot(pid, reset=self._reset_after_snapshot(pid))
                if event is not None:
                    events.append(event)
        return events

    def _gate_rate(self, learner: str) -> float | None:
        """The win rate a win-rate snapshot compares with ``snapshot.win_rate`` (default: the
        lowest against the reference opponents; None without any)."""
        refs = [p.key for p in self._reference_opponents(learner)]
        return float(self.win_rates.rates(learner, refs).min()) if refs else None

    def _reference_opponents(self, learner: str) -> list[Player]:
        """Opponents whose win rates decide a win-rate snapshot (default: the whole pool, less
        the players whose roles never seat them opposite the learner)."""
        return [p for p in self.candidates() if self._faces(learner, p.policy_id)]

    def _reset_after_snapshot(self, learner: str) -> bool:
        return False

    def _take_snapshot(self, pid: str, reset: bool = False) -> SnapshotEvent | None:
        self.last_snapshot[pid] = self.step
        version = self.versions[pid]
        if version in self.pool[pid]:
            return None  # weights unchanged since the last snapshot: nothing new to freeze
        self.pool[pid].append(version)
        dropped: list[Player] = []
        limit = self.rule.max_pool
        while limit is not None and len(self.pool[pid]) > limit:
            dropped.append(Player(pid, self.pool[pid].pop(0), snapshot=True))
        if reset:
            self.win_rates.forget(pid)
        return SnapshotEvent(Player(pid, version, snapshot=True), reset, tuple(dropped))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "pool": {k: list(v) for k, v in self.pool.items()},
                "last_snapshot": dict(self.last_snapshot), "turn": self._turn,
                "env_turn": dict(self._env_turn)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.pool = {k: [int(x) for x in v] for k, v in state["pool"].items()}
        self.last_snapshot = {k: int(v) for k, v in state["last_snapshot"].items()}
        self._turn = int(state["turn"])
        self._env_turn.update({k: int(v) for k, v in state.get("env_turn", {}).items()})


class Mirror(SelfPlayScheduler):
    """The learner plays its current self; both seats are trained on."""

    name = "mirror"
    uses_fixed = False

    def _opponent(self, learner: str, agent: str | None) -> Player:
        return self.current(learner, learning=True)

    def _can_fill(self, learner: str, agent: str) -> bool:
        return self.may_sit(learner, agent)


class Lagged(SelfPlayScheduler):
    """The learner plays its own snapshot from ``lag`` versions ago (the oldest one early on)."""

    name = "lagged"
    uses_fixed = False

    def __init__(self, entrants: Sequence[Entrant], envs: Sequence[str], seed: int = 0,
                 lag: int = 1, win_rate_decay: float = 0.99,
                 seats: Mapping[str, Sequence[str]] | None = None) -> None:
        if lag < 1:
            raise TournamentError(f"lagged self-play needs lag >= 1, got {lag}")
        rule = SnapshotRule(every=1, win_rate=None, min_steps=1, max_pool=lag + 1)
        super().__init__(entrants, envs, seed, snapshot=rule, win_rate_decay=win_rate_decay,
                         seats=seats)
        self.lag = lag

    def _can_fill(self, learner: str, agent: str) -> bool:
        return self.may_sit(learner, agent)

    def _opponent(self, learner: str, agent: str | None) -> Player:
        target = self.versions[learner] - self.lag
        older = [v for v in self.pool[learner] if v <= target]
        version = max(older) if older else min(self.pool[learner])
        return Player(learner, version, snapshot=True)


class UniformFSP(SelfPlayScheduler):
    """Opponent drawn uniformly from the pool (snapshots of all learners + fixed entrants)."""

    name = "fsp"

    def _opponent(self, learner: str, agent: str | None) -> Player:
        return self._choice(self.candidates(agent))



class Exploit(SelfPlayScheduler):
    """Learners train only against the fixed entrants, drawn uniformly; no snapshot ever enters
    the pool (an exploiter, or a best-response oracle, of frozen policies: the measurement of
    :mod:`agentrt.tournaments.exploiter`)."""

    name = "exploit"

    def __init__(self, entrants: Sequence[Entrant], envs: Sequence[str], seed: int = 0,
                 win_rate_decay: float = 0.99,
                 seats: Mapping[str, Sequence[str]] | None = None) -> None:
        if all(e.learning for e in entrants):
            raise TournamentError("format 'exploit' trains against fixed entrants; give a "
                                  "baseline or a policy with trainable: false")
        rule = SnapshotRule(every=None, win_rate=None, min_steps=1)
        super().__init__(entrants, envs, seed, snapshot=rule, win_rate_decay=win_rate_decay,
                         seats=seats)

    def _can_fill(self, learner: str, agent: str) -> bool:
        return any(self.may_sit(pid, agent) for pid in self.fixed)

    def _opponent(self, learner: str, agent: str | None) -> Player:
        return self._choice(self.fixed_players(agent))


class PFSP(SelfPlayScheduler):
    """Prioritized fictitious self-play (Vinyals et al. 2019, AlphaStar, Methods).

    Opponent B is drawn with probability f(x_B) / sum_C f(x_C), x_B = decayed P[learner beats B]
    (draws half, 0.5 before any game), f from :data:`PFSP_WEIGHTINGS`: "hard" (1 - x)^p or
    "variance" x(1 - x).
    """

    name = "pfsp"

    def __init__(self, entrants: Sequence[Entrant], envs: Sequence[str], seed: int = 0,
                 snapshot: SnapshotRule | None = None, weighting: str = "hard",
                 exponent: float = 2.0, win_rate_decay: float = 0.99,
                 seats: Mapping[str, Sequence[str]] | None = None) -> None:
        super().__init__(entrants, envs, seed, snapshot=snapshot, win_rate_decay=win_rate_decay,
                         seats=seats)
        pfsp_probs([0.5], weighting, exponent)  # unknown weighting: fail at construction
        self.weighting, self.exponent = weighting, exponent

    def opponent_probs(self, learner: str, agent: str | None = None
                       ) -> tuple[list[Player], np.ndarray]:
        """The pool (those allowed in the seat of ``agent`` when given) and the PFSP sampling
        probability of each member for ``learner``. In an N-seat match each other seat draws
        from its own pool independently; x is the pairwise win rate of the learner's seat
        against that player (see :class:`~agentrt.tournaments.scheduling.WinRates`)."""
        pool = self.candidates(agent)
        rates = self.win_rates.rates(learner, [p.key for p in pool])
        return pool, pfsp_probs(rates, self.weighting, self.exponent)

    def _opponent(self, learner: str, agent: str | None) -> Player:
        pool, probs = self.opponent_probs(learner, agent)
        return self._choice(pool, probs)
