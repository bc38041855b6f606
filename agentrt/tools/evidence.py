"""What ``agentrt debug`` weighs (:mod:`agentrt.tools.debug`): the sample, one cause's evidence,
and the thresholds of the leakage check (:mod:`agentrt.tools.leakage`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

COSINE = 0.95  # embedding match: cosine similarity at least this
MIN_ANSWER_CHARS = 3  # shorter answers ("7") are in any text; they are not matched exactly


@dataclass
class Sample:
    """What is debugged: a logged episode or a JSON file's sample."""

    source: str  # the episode id or the JSON file
    prompt: str
    response: str
    reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    step: int | None = None
    policy_version: int | None = None
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    logprobs: list[float] | None = None
    trained: bool = False  # an episode the run trained on (its prompt is in the train split)
    policy_id: str | None = None  # the policy that played it (None: the run's first learner)


@dataclass
class Cause:
    """One cause: ``found`` says whether the evidence points at it."""

    name: str
    found: bool
    summary: str
    evidence: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


def clip(text: str, n: int = 60) -> str:
    """``text`` as JSON, cut to ``n`` characters."""
    return json.dumps(text if len(text) <= n else text[:n - 3] + "...")
