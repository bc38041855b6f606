"""PSRO-Nash: the learner trains against a Nash mixture of the population's meta-game.

Policy-Space Response Oracles (Lanctot et al. 2017, "A Unified Game-Theoretic Approach to
Multiagent Reinforcement Learning") with the Nash meta-solver, run as one scheduler of the
controller loop (no inner loop of oracle runs):

- **population**: the frozen snapshots of every learner plus the fixed entrants (the pool of the
  other self-play formats). Version 0, the warm start, is its first member.
- **meta-game**: ``M[i, j]`` = P[member i beats member j] (draws half). A snapshot is its
  learner frozen, so its row is the learner's decayed win rates (:class:`WinRates`) against the
  members when it is frozen; ``M[j, i] = 1 - M[i, j]``; pairs never measured (two fixed entrants)
  are 0.5. To keep every entry measured, ``explore`` of the learner's games (default 0.1) go to
  a member drawn uniformly, the rest to a member drawn from the mixture.
- **meta-solver**: the maximin mixture of the symmetric zero-sum game ``M - 1/2`` (an LP,
  :func:`solve_symmetric_zero_sum`), which is a Nash equilibrium of it.
- **oracle**: the learner itself, trained by the run's objective against mixture draws; it enters
  the population (a snapshot, then the meta-game is re-solved) when its win rate against the
  mixture exceeds ``snapshot.win_rate``, or after ``snapshot.every`` steps.

:meth:`PSRO.meta_strategy` gives the mixture, so a run's evaluation reports the exact NashConv of
the mixture (``eval/nash_conv_mixture/<env>``) beside the latest policy's. The other self-play
formats give the average of the learner's iterates
(:meth:`~agentrt.tournaments.selfplay.SelfPlayScheduler.meta_strategy`: uniform over its
snapshots; fictitious play's average policy for ``fsp``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from scipy.optimize import linprog

from agentrt.tournaments.selfplay import SelfPlayScheduler, SnapshotRule
from agentrt.tournaments.types import Entrant, Player, SnapshotEvent, TournamentError


def solve_symmetric_zero_sum(payoff: np.ndarray) -> np.ndarray:
    """The maximin mixture of a zero-sum matrix game for the row player.

    Args:
        payoff: [K, K] the row player's payoff (for a meta-game of win rates, ``M - 0.5``).

    Returns:
        [K] probabilities x maximising min_j sum_i x_i payoff[i, j]; for an antisymmetric payoff
        this is a symmetric Nash equilibrium. Ties resolve to the LP's vertex (deterministic).
    """
    a = np.asarray(payoff, dtype=np.float64)
    k = a.shape[0]
    if a.ndim != 2 or a.shape[1] != k or k == 0:
        raise TournamentError(f"a meta-game needs a non-empty square payoff, got {a.shape}")
    # variables [x_1..x_K, v]: maximise v  s.t.  v - sum_i x_i a[i, j] <= 0 for every column j
    c = np.zeros(k + 1)
    c[-1] = -1.0
    a_ub = np.hstack([-a.T, np.ones((k, 1))])
    a_eq = np.hstack([np.ones((1, k)), np.zeros((1, 1))])
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(k), A_eq=a_eq, b_eq=[1.0],
                  bounds=[(0.0, None)] * k + [(None, None)], method="highs")
    if not res.success:  # never for a bounded finite game; uniform is the safe fallback
        return np.full(k, 1.0 / k)
    x = np.clip(res.x[:k], 0.0, None)
    return x / x.sum()


class PSRO(SelfPlayScheduler):
    """PSRO with a Nash meta-solver (see the module docstring).

    Args:
        explore: Share of the learner's games against a population member drawn uniformly
            (keeps every meta-game entry measured); the rest are drawn from the Nash mixture.
    """

    name = "psro"

    def __init__(self, entrants: Sequence[Entrant], envs: Sequence[str], seed: int = 0,
                 snapshot: SnapshotRule | None = None, explore: float = 0.1,
                 win_rate_decay: float = 0.99,
                 seats: Mapping[str, Sequence[str]] | None = None) -> None:
        super().__init__(entrants, envs, seed, snapshot=snapshot, win_rate_decay=win_rate_decay,
                         seats=seats)
        if not 0.0 <= explore <= 1.0:
            raise TournamentError(f"psro explore must be in [0, 1], got {explore}")
        self.explore = explore
        self.meta: dict[tuple[str, str], float] = {}  # (i, j) -> P[i beats j], measured
        self.mixture: dict[str, float] = {}
        self._solve()

    # ---- the meta-game -------------------------------------------------------------------
    def members(self) -> list[Player]:
        """The population: every snapshot, then the fixed entrants."""
        return self.candidates()

    def payoff(self) -> tuple[list[str], np.ndarray]:
        """Member keys and the meta-game matrix M[i, j] = P[i beats j] (see the docstring)."""
        keys = [p.key for p in self.members()]
        m = np.full((len(keys), len(keys)), 0.5)
        for i, a in enumerate(keys):
            for j, b in enumerate(keys):
                if (a, b) in self.meta:
                    m[i, j] = self.meta[(a, b)]
                elif (b, a) in self.meta:
                    m[i, j] = 1.0 - self.meta[(b, a)]
        return keys, m

    def _solve(self) -> None:
        keys, m = self.payoff()
        x = solve_symmetric_zero_sum(m - 0.5)
        self.mixture = {k: float(w) for k, w in zip(keys, x)}

    def meta_strategy(self, policy_id: str) -> dict[str, float]:
        """The Nash mixture over the population (member key -> weight) that ``policy_id``
        trains against; the league's policy is this mixture."""
        self.entrant(policy_id)
        return dict(self.mixture)

    def mixture_win_rate(self, learner: str) -> float:
        """The learner's expected win rate against the current mixture."""
        keys = list(self.mixture)
        w = np.array([self.mixture[k] for k in keys])
        return float(w @ self.win_rates.rates(learner, keys))

    # ---- scheduling ----------------------------------------------------------------------
    def _opponent(self, learner: str, agent: str | None) -> Player:
        pool = self.candidates(agent)
        if float(self.rng.random()) < self.explore:
            return self._choice(pool)
        w = np.array([self.mixture.get(p.key, 0.0) for p in pool])
        return self._choice(pool, w / w.sum() if w.sum() > 0 else None)

    def _gate_rate(self, learner: str) -> float:
        """A learner enters the population when it beats the mixture (``snapshot.win_rate``)."""
        return self.mixture_win_rate(learner)

    def _take_snapshot(self, pid: str, reset: bool = False) -> SnapshotEvent | None:
        """The snapshot, then its meta-game row (the learner's rates now) and a new mixture."""
        row = {p.key: self.win_rates.rate(pid, p.key) for p in self.members()}
        event = super()._take_snapshot(pid, reset)
        if event is not None:
            self.meta.update({(event.player.key, k): r for k, r in row.items()})
            dropped = {old.key for old in event.dropped}
            self.meta = {ab: r for ab, r in self.meta.items() if not dropped & set(ab)}
            self._solve()
        return event

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(),
                "meta": [[a, b, r] for (a, b), r in sorted(self.meta.items())],
                "mixture": dict(self.mixture)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.meta = {(a, b): float(r) for a, b, r in state["meta"]}
        self.mixture = {k: float(v) for k, v in state["mixture"].items()}
