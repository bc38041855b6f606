"""Rewards of ``examples/grpo_parquet.yaml`` that read an extra column of the data file.

A reward is ``fn(prompt, response, info)``; ``info`` holds the example's answer
(``info["answer"]``, from ``columns.answer``) and every ``columns.extra`` column under its own
name. ``agentrt.workloads.prompts.data.keyword_reward`` adapts a function that takes the columns as keyword
arguments instead.
"""

from __future__ import annotations

import re
from typing import Any

from agentrt.workloads.prompts.data.sources import keyword_reward


def _number(response: str) -> int | None:
    found = re.match(r"\s*(-?\d{1,12})", response)
    return int(found.group(1)) if found else None


def within_tolerance(prompt: str, response: str, info: dict[str, Any]) -> float:
    """1.0 when the reply's leading integer is within the row's ``tolerance`` of its answer."""
    del prompt
    got = _number(response)
    return float(got is not None and abs(got - int(info["answer"])) <= int(info["tolerance"]))


@keyword_reward
def closeness(prompt: str, response: str, answer: str, tolerance: int, **columns: Any) -> float:
    """The same check with the columns as keyword arguments, plus partial credit: 1 within
    tolerance, else 1 / (1 + distance beyond it); 0 when the reply has no number."""
    del prompt, columns
    got = _number(response)
    if got is None:
        return 0.0
    beyond = max(0, abs(got - int(answer)) - int(tolerance))
    return 1.0 / (1.0 + beyond)
