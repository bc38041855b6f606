"""A match format of its own: a gauntlet, where each learner meets every fixed opponent in turn.

A format is a builder ``(cfg, entrants, envs, seed, seats) -> Scheduler``. Registered in
``SCHEDULERS`` it is named in YAML by its name (``schedule: {format: gauntlet}``); unregistered,
by its path (``format: nim_plugin.schedule:gauntlet``). Subclasses of
:class:`~agentrt.tournaments.scheduling.Scheduler` implement ``_next_groups`` and, when they
keep state of their own, ``state_dict``/``load_state_dict`` (what a resumed run restores).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from agentrt.tournaments.config import SCHEDULERS, ScheduleConfig
from agentrt.tournaments.scheduling import Group, Scheduler
from agentrt.tournaments.types import Entrant, TournamentError


class Gauntlet(Scheduler):
    """Learner i plays fixed opponent j, then j+1, ...: every opponent as often as the others."""

    name = "gauntlet"

    def __init__(self, entrants: Sequence[Entrant], envs: Sequence[str], seed: int = 0,
                 seats: Mapping[str, Sequence[str]] | None = None) -> None:
        super().__init__(entrants, envs, seed, seats)
        self.learners = [e.policy_id for e in entrants if e.learning]
        self.opponents = [e.policy_id for e in entrants if not e.learning]
        if not self.learners or not self.opponents:
            raise TournamentError("a gauntlet needs a learner and a fixed opponent")
        self.turn = 0

    def _next_groups(self, n: int) -> list[Group]:
        out = []
        for _ in range(n):
            learner = self.learners[self.turn % len(self.learners)]
            rival = self.opponents[(self.turn // len(self.learners)) % len(self.opponents)]
            out.append(Group((self.current(learner), self.current(rival))))
            self.turn += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "turn": self.turn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.turn = int(state["turn"])


def gauntlet(cfg: ScheduleConfig, entrants: Sequence[Entrant], envs: Sequence[str], seed: int,
             seats: Mapping[str, Sequence[str]] | None) -> Scheduler:
    return Gauntlet(entrants, envs, seed, seats=seats)


SCHEDULERS.add("gauntlet", gauntlet)
