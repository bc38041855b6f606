"""Reward SDK: a reward is a function ``(prompt: str, response: str, info: dict) -> float``.

Register one by name::

    from agentrt.rewards import reward

    @reward("my_reward")
    def my_reward(prompt: str, response: str, info: dict) -> float:
        return float(response.strip() == info["answer"])

or reference any importable function from YAML as ``reward: my_package.rewards:my_reward``.
``prompt`` and ``response`` are the decoded texts, ``info`` the example's info (e.g. its answer).
A reward that raises or returns a non-finite value marks that sample as failed: it gets
reward 0, is counted in ``reward/errors``, and the run goes on.
"""

from __future__ import annotations

import importlib
import logging
import math
from typing import Any, Callable

from agentrt.errors import ConfigError
from agentrt.registry import Registry

RewardFn = Callable[[str, str, dict[str, Any]], float]
REWARDS: Registry[RewardFn] = Registry("reward")
log = logging.getLogger(__name__)


def reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering a reward function under ``name``."""
    return REWARDS.register(name)


@reward("exact_match")
def exact_match(prompt: str, response: str, info: dict[str, Any]) -> float:
    """1.0 when the response (whitespace-stripped) equals ``info['answer']``, else 0.0."""
    del prompt
    return float(response.strip() == str(info["answer"]).strip())


def resolve_reward(spec: str) -> RewardFn:
    """A registered name, or 'package.module:function'. Raises ConfigError naming the problem."""
    if ":" not in spec:
        try:
            return REWARDS.get(spec)
        except KeyError as exc:
            raise ConfigError(f"reward: {exc.args[0]}; or give 'module:function'") from None
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"reward: cannot import module {module_name!r} ({exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"reward: {module_name!r} has no function {attr!r}")
    return fn


def score(fn: RewardFn, samples: list[tuple[str, str, dict[str, Any]]]) -> tuple[list[float], int]:
    """Applies ``fn`` to each (prompt, response, info). Returns (rewards, number of failures)."""
    rewards: list[float] = []
    errors = 0
    for prompt, response, info in samples:
        try:
            value = float(fn(prompt, response, info))
            if not math.isfinite(value):
                raise ValueError(f"reward is not finite: {value}")
        except Exception as exc:  # noqa: BLE001 - user code may raise anything
            errors += 1
            if errors == 1:
                log.warning("reward function failed (sample marked, run continues): %r", exc)
            value = 0.0
        rewards.append(value)
    return rewards, errors
