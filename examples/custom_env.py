"""A new turn-based game in one small file, played through the episode runner.

Nim: a pile of stones; players alternately take 1-3; whoever takes the last stone wins.

    .venv/bin/python examples/custom_env.py
"""

from __future__ import annotations

from typing import Any

from agentrt.envs import MultiAgentEnv, check_multiagent_env, register
from agentrt.policies import RandomPolicy
from agentrt.runner import EpisodeRunner, specs


class Nim(MultiAgentEnv):
    """Take 1-3 stones; taking the last one wins (+1, the other -1)."""

    metadata = {"render_modes": ["ansi"], "name": "nim"}
    possible_agents = ["player_0", "player_1"]

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


def perfect(request) -> str:
    """Leave a multiple of 4 when possible (a plain callable is a policy too)."""
    stones = int(request.observation.split()[1])
    return str(stones % 4 or 1)


if __name__ == "__main__":
    register("Nim-v0", Nim, multi_agent=True)
    check_multiagent_env(Nim())
    runner = EpisodeRunner({"perfect": perfect, "random": RandomPolicy(seed=0)})
    result = runner.run(specs("Nim-v0", ("perfect", "random"), 1000))
    print({k: round(v, 3) for k, v in result.metrics.items() if k.startswith("match/")})
