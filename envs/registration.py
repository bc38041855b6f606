"""Environment registry: ``register("MyGame-v0", MyGame)`` and ``make("MyGame-v0", **kwargs)``.

Single-agent envs are also registered with Gymnasium as ``agentrt/<id>``, so
``gymnasium.make("agentrt/Task-v0")`` works and Gymnasium's tools (``check_env``, wrappers) see a
spec. Entry points may be a class/callable or a ``"module:attr"`` string, imported only on
``make`` (optional adapters such as OpenSpiel live behind such strings).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

import gymnasium as gym

from agentrt.envs.core import MultiAgentEnv, SingleAgentGame
from agentrt.core.errors import ConfigError
from agentrt.core.registry import Registry


@dataclass(frozen=True)
class EnvSpec:
    """How to build one registered environment.

    Attributes:
        id: Name used in ``make`` and in configs ("TicTacToe-v0").
        entry_point: Class or factory, or "module:attr" imported lazily.
        multi_agent: True for turn-based multi-agent envs, False for ``gymnasium.Env`` ones.
        kwargs: Default keyword arguments (overridden by those given to ``make``).
        extra: pip extra that provides a missing dependency ("games"), for the error message.
    """

    id: str
    entry_point: Callable[..., Any] | str
    multi_agent: bool
    kwargs: dict[str, Any] = field(default_factory=dict)
    extra: str | None = None


ENVS: Registry[EnvSpec] = Registry("environment")


def register(env_id: str, entry_point: Callable[..., Any] | str, *, multi_agent: bool,
             extra: str | None = None, **kwargs: Any) -> EnvSpec:
    """Registers an environment under ``env_id``; a duplicate id raises KeyError."""
    spec = EnvSpec(env_id, entry_point, multi_agent, dict(kwargs), extra)
    ENVS.add(env_id, spec)
    if not multi_agent:
        gym.register(id=f"agentrt/{env_id}", entry_point=_gym_entry(env_id), kwargs=dict(kwargs),
                     disable_env_checker=True)
    return spec


def _gym_entry(env_id: str) -> Callable[..., Any]:
    def build(**kwargs: Any) -> Any:
        return _load(ENVS.get(env_id))(**kwargs)

    return build


def _load(spec: EnvSpec) -> Callable[..., Any]:
    if not isinstance(spec.entry_point, str):
        return spec.entry_point
    module_name, _, attr = spec.entry_point.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = f"; install it with pip install 'agentrt[{spec.extra}]'" if spec.extra else ""
        raise ConfigError(f"environment {spec.id!r} needs a missing package ({exc.name}){extra}"
                          ) from None
    return getattr(module, attr)


def make(env_id: str, /, **kwargs: Any) -> Any:
    """Builds a registered environment: a ``gymnasium.Env`` or a :class:`MultiAgentEnv`.

    Raises:
        ConfigError: unknown id (the message lists the valid ones) or missing optional package.
    """
    try:
        spec = ENVS.get(env_id)
    except KeyError as exc:
        raise ConfigError(str(exc.args[0])) from None
    env = _load(spec)(**{**spec.kwargs, **kwargs})
    if not spec.multi_agent:
        # Same spec object Gymnasium's make would set, so check_env can re-make the env.
        env.spec = dataclasses.replace(gym.spec(f"agentrt/{env_id}"),
                                       kwargs={**spec.kwargs, **kwargs})
    return env


def make_multi(env_id: str, /, **kwargs: Any) -> MultiAgentEnv:
    """Like :func:`make`, but single-agent envs come wrapped in :class:`SingleAgentGame`."""
    env = make(env_id, **kwargs)
    return env if isinstance(env, MultiAgentEnv) else SingleAgentGame(env)


def is_multi_agent(env_id: str) -> bool:
    """Whether ``env_id`` is a turn-based multi-agent env."""
    try:
        return ENVS.get(env_id).multi_agent
    except KeyError as exc:
        raise ConfigError(str(exc.args[0])) from None
