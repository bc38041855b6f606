"""Exact solution of small two-player zero-sum games with perfect information: every env that
gives ``state_key()`` (tic-tac-toe, Hexapawn, Connect-Three, a user's game) and can be copied.

:class:`GameSolver` searches the tree below a state once (memoised on the key) and keeps the
value of every state for the agent to move, discounted by ``DISCOUNT`` a move so that among
moves of equal game value a faster win and a slower loss score higher. The perfect scripted
player (``kind: perfect``) plays its best moves.
"""

from __future__ import annotations

import copy
import sys
from typing import Any, Hashable

DISCOUNT = 0.99
TIE = 1e-9
MAX_STATES = 200_000


class GameSolver:
    """Values of one game's states, filled lazily as states are asked about.

    Args:
        max_states: Refuse (ValueError) a game whose tree holds more states than this.
    """

    def __init__(self, max_states: int = MAX_STATES) -> None:
        self.max_states = max_states
        self.values: dict[Hashable, float] = {}

    def move_values(self, env: Any) -> dict[str, float]:
        """The value of each legal action text for the agent to move in ``env`` (not stepped)."""
        agent = env.agent_selection
        out = {}
        for action in env.legal_actions(agent) or []:
            child = copy.deepcopy(env)
            child.step(action)
            out[action] = self._after(child, agent)
        return out

    def best_moves(self, env: Any) -> list[str]:
        """The legal actions of the best (discounted) value for the agent to move."""
        values = self.move_values(env)
        if not values:
            return []
        best = max(values.values())
        return [a for a, v in values.items() if v >= best - TIE]

    def value(self, env: Any) -> float:
        """The discounted game value of ``env``'s state for the agent to move (+1 win now)."""
        key = env.state_key()
        if key not in self.values:
            if len(self.values) >= self.max_states:
                raise ValueError(f"{type(env).__name__}: more than {self.max_states} states; "
                                 "too large to solve exactly")
            limit = sys.getrecursionlimit()
            sys.setrecursionlimit(max(limit, 10_000))
            try:
                self.values[key] = max(self.move_values(env).values(), default=0.0)
            finally:
                sys.setrecursionlimit(limit)
        return self.values[key]

    def _after(self, child: Any, mover: str) -> float:
        """What a move that led to ``child`` is worth to ``mover``."""
        if child.done:
            return float(child.rewards.get(mover, 0.0))
        sign = 1.0 if child.agent_selection == mover else -1.0
        return sign * DISCOUNT * self.value(child)
