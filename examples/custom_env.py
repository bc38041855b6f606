"""A new turn-based game, checked and played through the episode runner.

The game is Nim (a pile of stones; players alternately take 1-3; whoever takes the last stone
wins), written in one small file as a plugin: examples/plugin_pkg/nim_plugin/env.py. Copy that
file for a game of your own: subclass MultiAgentEnv, fill in _reset, _legal, _apply and _observe,
set ``zero_sum = True`` if the returns of every game sum to zero (leagues then use RAE), and
``register`` it; configs then name it after ``imports: [your_module]`` (docs/plugins.md).

    .venv/bin/python examples/custom_env.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentrt.envs.checker import check_multiagent_env
from agentrt.policies.scripted import RandomPolicy
from agentrt.runner.core import EpisodeRunner, specs

sys.path.append(str(Path(__file__).resolve().parent / "plugin_pkg"))
from nim_plugin.env import Nim  # noqa: E402 - registers Nim-v0


def perfect(request) -> str:
    """Leave a multiple of 4 when possible (a plain callable is a policy too)."""
    stones = int(request.observation.split()[1])
    return str(stones % 4 or 1)


if __name__ == "__main__":
    check_multiagent_env(Nim())
    runner = EpisodeRunner({"perfect": perfect, "random": RandomPolicy(seed=0)})
    result = runner.run(specs("Nim-v0", ("perfect", "random"), 1000))
    print({k: round(v, 3) for k, v in result.metrics.items() if k.startswith("match/")})
