"""The AlphaStar league: main agents, main exploiters and league exploiters.

Follows the published pseudocode of Vinyals et al. 2019 (Nature 575, "Grandmaster level in
StarCraft II", supplementary ``pseudocode.py``), with steps instead of game frames:

- **main** agents: with prob ``pfsp_prob`` (0.5) PFSP-"hard" over all frozen players; otherwise
  pick a main agent X (maybe itself) and, with prob ``verification_prob`` (0.15), first check
  (a) main-exploiter snapshots it beats less than 30% of the time and (b) snapshots of X it has
  forgotten how to beat (< 70%); else self-play against live X if it wins > 30% of games against
  X, or PFSP-"variance" over X's snapshots as a curriculum.
- **main exploiters**: play a live main agent if they win > 10% against it, else PFSP-"variance"
  over its snapshots; after each snapshot they are reset to their initial weights.
- **league exploiters**: PFSP-"linear_capped" (min(0.5, 1 - x)) over all frozen players; reset
  with prob 0.25 after each snapshot.

Frozen players are the snapshots of every learner plus the fixed entrants (scripted baselines).
Only the learner a match was scheduled *for* is trained on it (its seat has ``learning=True``);
a live main agent met by an exploiter plays with current weights but is not trained on that match,
except in main-vs-main self-play where both seats train. Snapshot rule: after ``min_steps``, when
the learner's lowest win rate against its reference opponents (main: all frozen players; main
exploiter: the main agents; league exploiter: all frozen players) exceeds ``win_rate`` or after
``every`` steps.

Seats and roles: in an N-seat match every other seat draws its opponent by the rules above,
independently, among the players allowed in that seat (entrant ``roles``; snapshots keep their
learner's). When a rule's pool has nobody allowed there (e.g. no main agent may take the seat),
the draw falls back to PFSP over all frozen players allowed there, with the rule's weighting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from agentrt.tournaments.scheduling import pfsp_probs
from agentrt.tournaments.selfplay import SelfPlayScheduler, SnapshotRule
from agentrt.tournaments.types import Entrant, Player, TournamentError

ROLES = ("main", "main_exploiter", "league_exploiter")


@dataclass(frozen=True)
class LeagueOptions:
    """Probabilities and thresholds of the league (AlphaStar values as defaults)."""

    pfsp_prob: float = 0.5
    verification_prob: float = 0.15
    selfplay_min_win_rate: float = 0.3
    exploiter_min_win_rate: float = 0.1
    verification_exploiter_win_rate: float = 0.3
    verification_forgetting_win_rate: float = 0.7
    league_exploiter_reset_prob: float = 0.25


def remove_monotonic_suffix(rates: np.ndarray, players: list[Player]
                            ) -> tuple[np.ndarray, list[Player]]:
    """Drops the trailing run of snapshots whose win rates only decrease (recent ones not yet
    'forgotten', AlphaStar pseudocode); returns empty when the whole sequence is monotonic."""
    for i in range(len(rates) - 1, 0, -1):
        if rates[i - 1] < rates[i]:
            return rates[: i + 1], players[: i + 1]
    return np.array([]), []


class League(SelfPlayScheduler):
    """League training with roles (see the module docstring)."""

    name = "league"

    def __init__(self, entrants: Sequence[Entrant], envs: Sequence[str], seed: int = 0,
                 snapshot: SnapshotRule | None = None, options: LeagueOptions | None = None,
                 win_rate_decay: float = 0.99,
                 seats: Mapping[str, Sequence[str]] | None = None) -> None:
        super().__init__(entrants, envs, seed, snapshot=snapshot, win_rate_decay=win_rate_decay,
                         seats=seats)
        self.roles = {e.policy_id: e.league_role for e in entrants if e.learning}
        bad = {p: r for p, r in self.roles.items() if r not in ROLES}
        if bad:
            raise TournamentError(f"unknown league roles {bad}; valid: {', '.join(ROLES)}")
        if "main" not in self.roles.values():
            raise TournamentError("a league needs at least one learner with league_role 'main'")
        self.opts = options or LeagueOptions()

    def mains(self, agent: str | None = None) -> list[str]:
        """Main agents (those allowed in the seat of ``agent`` when given)."""
        return [p for p, r in self.roles.items() if r == "main" and self.may_sit(p, agent)]

    def _pfsp(self, learner: str, pool: list[Player], weighting: str,
              agent: str | None = None) -> Player:
        """PFSP over ``pool``; over every frozen player allowed at ``agent`` if it is empty."""
        pool = pool or self.candidates(agent)
        rates = self.win_rates.rates(learner, [p.key for p in pool])
        return self._choice(pool, pfsp_probs(rates, weighting, 2.0))

    def _live(self, pid: str) -> Player:
        """A live learner as an opponent: current weights, not trained on this match."""
        return self.current(pid, learning=False)

    def _opponent(self, learner: str, agent: str | None) -> Player:
        role = self.roles[learner]
        if role == "main":
            return self._main_opponent(learner, agent)
        if role == "main_exploiter":
            mains = self.mains(agent)
            if not mains:
                return self._pfsp(learner, [], "variance", agent)
            target = self._choice(mains)
            if self.win_rates.rate(learner, target) > self.opts.exploiter_min_win_rate:
                return self._live(target)
            return self._pfsp(learner, self.snapshots(target), "variance", agent)
        return self._pfsp(learner, self.candidates(agent), "linear_capped", agent)

    def _main_opponent(self, learner: str, agent: str | None) -> Player:
        coin = float(self.rng.random())
        if coin < self.opts.pfsp_prob:
            return self._pfsp(learner, self.candidates(agent), "hard", agent)
        mains = self.mains(agent)
        if not mains:
            return self._pfsp(learner, [], "variance", agent)
        target = self._choice(mains)
        if coin < self.opts.pfsp_prob + self.opts.verification_prob:
            checked = self._verification(learner, target, agent)
            if checked is not None:
                return checked
        if target == learner:
            return self.current(learner, learning=True)  # mirror: both seats train
        if self.win_rates.rate(learner, target) > self.opts.selfplay_min_win_rate:
            return self._live(target)
        return self._pfsp(learner, self.snapshots(target), "variance", agent)

    def _verification(self, learner: str, target: str, agent: str | None) -> Player | None:
        exploiters = [p for p, r in self.roles.items() if r == "main_exploiter"]
        exp_snaps = [s for pid in exploiters for s in self.snapshots(pid, agent)]
        rates = self.win_rates.rates(learner, [p.key for p in exp_snaps])
        if len(rates) and rates.min() < self.opts.verification_exploiter_win_rate:
            return self._pfsp(learner, exp_snaps, "hard", agent)
        own = self.snapshots(target)
        rates, own = remove_monotonic_suffix(self.win_rates.rates(learner, [p.key for p in own]),
                                             own)
        if len(rates) and rates.min() < self.opts.verification_forgetting_win_rate:
            return self._pfsp(learner, own, "hard", agent)
        return None

    def _reference_opponents(self, learner: str) -> list[Player]:
        if self.roles[learner] == "main_exploiter":
            return [self._live(pid) for pid in self.mains() if self._faces(learner, pid)]
        return super()._reference_opponents(learner)

    def _reset_after_snapshot(self, learner: str) -> bool:
        role = self.roles[learner]
        if role == "main_exploiter":
            return True
        if role == "league_exploiter":
            return bool(self.rng.random() < self.opts.league_exploiter_reset_prob)
        return False

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "roles": dict(self.roles)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if state["roles"] != self.roles:
            raise TournamentError(
                f"saved league roles {state['roles']} differ from the configured {self.roles}"
            )
