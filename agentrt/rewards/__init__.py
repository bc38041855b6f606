"""Reward SDK: a reward is a function ``(prompt: str, response: str, info: dict) -> float``.

Register one by name::

    from agentrt.rewards import reward

    @reward("my_reward")
    def my_reward(prompt: str, response: str, info: dict) -> float:
        return float(response.strip() == info["answer"])

or reference any importable function from YAML as ``reward: my_package.rewards:my_reward``.
``prompt`` and ``response`` are the decoded texts, ``info`` the example's info (e.g. its answer).
A reward that raises, returns NaN/inf or a value beyond ``±REWARD_LIMIT`` (1e9: larger values
overflow float32 statistics such as the group std) marks that sample as failed: it gets reward 0
and is counted in ``reward/errors`` and ``reward/error_rate``. The run goes on unless more than
``guards.max_reward_error_rate`` of a step's samples failed (:mod:`agentrt.controller.guards`).

Where rewards come from is a *source* (:mod:`agentrt.rewards.sources`, docs/rewards.md): a
Python function (``reward: name``, or ``{python: name, workers: 4, timeout_s: 5}``), an HTTP
reward service (``{http: URL}``) or a learned reward model (``{model: FOLDER}``); several combine
with weights (``reward: [{python: exact_match, weight: 0.7}, {model: rm, weight: 0.3}]``). Each
source is a :class:`~agentrt.rewards.executors.RewardExecutor` that scores a whole step's samples
in one ``score_batch`` call.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

from agentrt.core.errors import ConfigError
from agentrt.core.registry import Registry, import_callable

RewardFn = Callable[[str, str, dict[str, Any]], float]
REWARDS: Registry[RewardFn] = Registry("reward")
REWARD_LIMIT = 1e9
log = logging.getLogger(__name__)


def reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering a reward function under ``name``."""
    return REWARDS.register(name)


@reward("exact_match")
def exact_match(prompt: str, response: str, info: dict[str, Any]) -> float:
    """1.0 when the response (whitespace-stripped) equals ``info['answer']``, else 0.0."""
    del prompt
    return float(response.strip() == str(info["answer"]).strip())


def resolve_reward(spec: str, field: str = "reward") -> RewardFn:
    """A registered name, or 'package.module:function'. Raises ConfigError naming ``field``."""
    if ":" not in spec:
        try:
            return REWARDS.get(spec)
        except KeyError as exc:
            raise ConfigError(f"{field}: {exc.args[0]}; or give 'module:function'") from None
    return import_callable(spec, field)


def checked(value: Any) -> float:
    """``value`` as a float reward; ValueError when it is not finite or beyond ±REWARD_LIMIT."""
    value = float(value)
    if not math.isfinite(value) or abs(value) > REWARD_LIMIT:
        raise ValueError(f"reward {value} is not a finite number within ±{REWARD_LIMIT:g}")
    return value


def score(fn: RewardFn, samples: list[tuple[str, str, dict[str, Any]]]) -> tuple[list[float], int]:
    """Applies ``fn`` to each (prompt, response, info). Returns (rewards, number of failures)."""
    rewards: list[float] = []
    errors = 0
    for prompt, response, info in samples:
        try:
            value = checked(fn(prompt, response, info))
        except Exception as exc:  # noqa: BLE001 - user code may raise anything
            errors += 1
            if errors == 1:
                log.warning("reward function failed (sample marked, run continues): %r", exc)
            value = 0.0
        rewards.append(value)
    return rewards, errors


__all__ = ["REWARDS", "REWARD_LIMIT", "RewardFn", "checked", "exact_match", "resolve_reward",
           "reward", "score"]
