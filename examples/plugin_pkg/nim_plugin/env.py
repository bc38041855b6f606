"""Nim: one pile of stones; players alternately take 1-3; whoever takes the last stone wins."""

from __future__ import annotations

from typing import Any

from agentrt.envs.core import MultiAgentEnv
from agentrt.envs.registration import register


class Nim(MultiAgentEnv):
    """Take 1-3 stones; taking the last one wins (+1, the other -1)."""

    metadata = {"render_modes": ["ansi"], "name": "nim"}
    possible_agents = ["player_0", "player_1"]
    zero_sum = True  # leagues then default to role-conditioned (RAE) advantages

    def __init__(self, stones: int = 15, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        self.stones0 = stones

    def _reset(self, options: dict[str, Any]) -> None:
        self.stones = int(options.get("stones", self.stones0))
        self.agent_selection = "player_0"

    def _legal(self, agent: str) -> list[str] | None:
        return [str(k) for k in (1, 2, 3) if k <= self.stones]

    def _apply(self, agent: str, move: str) -> None:  # move is one of the legal strings
        self.stones -= int(move)
        other = "player_1" if agent == "player_0" else "player_0"
        if self.stones == 0:
            self.rewards[agent], self.rewards[other] = 1.0, -1.0
            self._finish()
        else:
            self.agent_selection = other

    def _observe(self, agent: str) -> str:
        return f"Nim: {self.stones} stones left. Take 1, 2 or 3; taking the last one wins."

    def state_key(self) -> tuple[int, str]:
        """The whole state, hashable: perfect play (kind: perfect) and exact best responses
        search the game tree memoised on it."""
        return (self.stones, self.agent_selection)

    def observe_struct(self, agent: str) -> dict[str, int]:
        """What a scripted player reads instead of parsing the text."""
        return {"stones": self.stones}


register("Nim-v0", Nim, multi_agent=True)
