"""A perfect Nim player as a scripted policy (a league opponent or a warm-start teacher)."""

from __future__ import annotations

from agentrt.policies.base import ActRequest
from agentrt.policies.scripted import SCRIPTED, ScriptedPolicy


def best_take(stones: int) -> int:
    """Leave a multiple of 4 when possible, else take 1."""
    return stones % 4 or 1


class OptimalNim(ScriptedPolicy):
    """Always leaves a multiple of 4 stones when it can (wins from any other position)."""

    def choose(self, request: ActRequest) -> str:
        return str(min(best_take(request.state["stones"]), request.state["stones"]))


SCRIPTED.add("optimal-nim", OptimalNim)
