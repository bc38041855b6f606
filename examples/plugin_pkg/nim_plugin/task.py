"""A single-policy task on Nim positions and its reward, for ``agentrt train``."""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentrt.rewards import reward
from agentrt.envs.tasks import TASKS, Example
from nim_plugin.players import best_take


class NimMoveOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_stones: int = Field(30, ge=2, description="Largest pile in a prompt.")


@TASKS.register("nim-move")
class NimMove:
    """'nim 13:' -> the winning take (13 % 4 = 1), any of 1-3 where no move wins."""

    options_model = NimMoveOptions

    def __init__(self, options: dict[str, Any]) -> None:
        self.opts = NimMoveOptions(**options)

    def make_example(self, rng: random.Random) -> Example:
        stones = rng.randint(1, self.opts.max_stones)
        answer = str(min(best_take(stones), stones))
        return Example(prompt=f"nim {stones}:", answer=answer,
                       info={"answer": answer, "stones": stones})


@reward("nim_optimal")
def nim_optimal(prompt: str, response: str, info: dict[str, Any]) -> float:
    """1 for a take that leaves a multiple of 4 (the only winning moves), 0.5 for any other
    legal take where no move wins, 0 for an illegal one."""
    del prompt
    text = response.strip()
    if text not in ("1", "2", "3") or int(text) > info["stones"]:
        return 0.0
    left = info["stones"] - int(text)
    if left % 4 == 0:
        return 1.0
    return 0.5 if info["stones"] % 4 == 0 else 0.0
