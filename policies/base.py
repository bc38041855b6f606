"""The Policy protocol: one batch call, ``act(requests) -> actions``, for every kind of policy.

The episode runner gathers the requests of all episodes that wait on the same policy and calls
its ``act`` once, so an LM policy can answer them with one batched generate call. A policy is:

- an LM policy (:class:`agentrt.policies.lm.LMPolicy`), the only kind that produces training data;
- a scripted policy (:mod:`agentrt.policies.scripted`: random, heuristics, minimax);
- any plain callable ``fn(request) -> str``, wrapped by :func:`as_policy`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from agentrt.core.types import Turn

log = logging.getLogger(__name__)


class ActRequest:
    """One agent of one episode waiting for its action.

    Attributes:
        episode_id: Unique id of the episode.
        env_name: Registered env id ("TicTacToe-v0"); selects the prompt template.
        agent: The acting agent's role name ("player_0", "agent").
        seat: Index of the agent in the env's ``possible_agents``.
        turn_index: How many turns this agent has taken before in this episode.
        attempt: 0, or the number of invalid actions it just made (runner "retry" mode).
        previous: This agent's previous :class:`Turn` in this episode (None at its first turn);
            an LM policy continues the token history from ``previous.prompt_ids +
            previous.response_ids``.

    ``observation``, ``legal_actions`` and ``state`` are read from the env when first used (cheap
    for scripted policies that never look at the text); ``max_new_tokens`` is the env's token
    budget for this action (``env.max_new_tokens(agent)``, None when the env sets none).
    """

    __slots__ = ("episode_id", "env_name", "agent", "seat", "turn_index", "attempt", "previous",
                 "_env", "_obs", "_legal", "_state")

    def __init__(self, env: Any, episode_id: str, env_name: str, agent: str, seat: int,
                 turn_index: int = 0, attempt: int = 0, previous: Turn | None = None) -> None:
        self._env = env
        self.episode_id = episode_id
        self.env_name = env_name
        self.agent = agent
        self.seat = seat
        self.turn_index = turn_index
        self.attempt = attempt
        self.previous = previous
        self._obs: str | None = None
        self._legal: Any = ()
        self._state: Any = ()

    @property
    def observation(self) -> str:
        """The agent's text observation now."""
        if self._obs is None:
            self._obs = self._env.observe(self.agent)
        return self._obs

    @property
    def legal_actions(self) -> list[str] | None:
        """Legal action strings, or None when any text is allowed."""
        if self._legal == ():
            self._legal = self._env.legal_actions(self.agent)
        return self._legal

    @property
    def state(self) -> Any:
        """The env's structured view for this agent (``observe_struct``), for scripted policies."""
        if self._state == ():
            self._state = self._env.observe_struct(self.agent)
        return self._state

    @property
    def game(self) -> Any:
        """The env itself, for scripted players that search the game tree (``kind: perfect``):
        they copy it and never step it."""
        return self._env

    @property
    def max_new_tokens(self) -> int | None:
        """The env's token budget of this action, if it has one."""
        budget = getattr(self._env, "max_new_tokens", None)
        return budget(self.agent) if callable(budget) else None

    def __repr__(self) -> str:
        return (f"ActRequest(env={self.env_name!r}, agent={self.agent!r}, "
                f"turn={self.turn_index}, attempt={self.attempt})")


@dataclass
class Action:
    """A policy's answer to one request.

    Attributes:
        text: The action for the env (any text; the env judges it).
        turn: The LM turn that produced it (token ids and log-probs), None for non-LM policies.
        truncate: True when the policy cannot go on (e.g. its context is full); the runner then
            ends the episode as truncated.
        error: Set when the policy raised instead of acting (the exception, one line); the
            runner counts it as an invalid action, or with ``policy_errors="record"`` hands it
            to the env's ``on_policy_error`` hook.
    """

    text: Any
    turn: Turn | None = None
    truncate: bool = False
    error: str | None = None


@runtime_checkable
class Policy(Protocol):
    """What the episode runner calls. ``trainable`` policies' turns become trajectories."""

    trainable: bool

    def act(self, requests: list[ActRequest]) -> list[Action]:
        """Returns one action per request, in order."""
        ...


class CallablePolicy:
    """Wraps ``fn(request: ActRequest) -> str | Action`` into a :class:`Policy`.

    An exception raised by ``fn`` becomes an empty (invalid) action for that request, counted by
    the runner like any invalid action; the first one is logged.
    """

    trainable = False
    version = 0

    def __init__(self, fn: Callable[[ActRequest], Any]) -> None:
        self.fn = fn
        self.errors = 0

    def act(self, requests: list[ActRequest]) -> list[Action]:
        out = []
        for req in requests:
            try:
                result = self.fn(req)
            except Exception as exc:  # noqa: BLE001 - user code may raise anything
                self.errors += 1
                if self.errors == 1:
                    log.warning("policy callable raised (action counted invalid): %r", exc)
                out.append(Action(None, error=f"{type(exc).__name__}: {exc}"))
                continue
            out.append(result if isinstance(result, Action) else Action(result))
        return out


def as_policy(obj: Any) -> Policy:
    """A :class:`Policy` as is, or a callable wrapped in :class:`CallablePolicy`."""
    if hasattr(obj, "act") and hasattr(obj, "trainable"):
        return obj
    if callable(obj):
        return CallablePolicy(obj)
    raise TypeError(f"a policy needs act(requests) and trainable, or must be callable; "
                    f"got {type(obj).__name__}")
