"""Env APIs: a Gymnasium ``TextEnv`` for one agent and a turn-based ``MultiAgentEnv`` for several.

Single agent (exactly Gymnasium's shapes)::

    obs, info = env.reset(seed=0)                     # obs: str
    obs, reward, terminated, truncated, info = env.step("42")

Several agents (PettingZoo's AEC shape, turn-based)::

    env.reset(seed=0)                       # returns None, like PettingZoo
    while not env.done:
        agent = env.agent_selection         # whose turn it is
        obs = env.observe(agent)            # that agent's text view (hidden info stays hidden)
        legal = env.legal_actions(agent)    # list[str], or None for free text
        env.step("4")                       # sets env.rewards / terminations / truncations / infos

Differences from PettingZoo, on purpose: a game ends for every agent at once (``env.done``), so
no "dead steps" with ``None`` are needed; actions are text; an invalid action never raises: the
state is left unchanged, the same agent moves again, ``infos[agent]["invalid_action"]`` is True
and the agent's next observation starts with a note saying why. The episode runner decides whether
an invalid action ends the game or is asked again (``RunnerConfig.invalid_action``).
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Text
from gymnasium.utils import seeding

# Printable ASCII (with newline and tab): what observations of built-in envs are made of.
CHARSET = string.printable
_CHARSET = frozenset(CHARSET)
MAX_ACTION_CHARS = 4096


def text_space(max_length: int) -> Text:
    """A Gymnasium ``Text`` space over printable ASCII, empty strings allowed."""
    return Text(max_length=max_length, min_length=0, charset=CHARSET)


def clean_text(text: str, limit: int) -> str:
    """Keeps ``text`` inside :data:`CHARSET` (others become '?') and at most ``limit`` chars."""
    text = text[:limit]
    if all(c in _CHARSET for c in text):
        return text
    return "".join(c if c in _CHARSET else "?" for c in text)


def action_text(action: Any, limit: int = MAX_ACTION_CHARS) -> str | None:
    """Turns whatever a policy returned into text, or None when it can never be a valid action.

    Bytes are decoded as UTF-8 with replacement characters, lone surrogates are replaced, ints
    become their decimal string, and anything longer than ``limit`` characters is rejected.
    """
    if isinstance(action, str):
        text = action
    elif isinstance(action, (bytes, bytearray)):
        text = bytes(action).decode("utf-8", errors="replace")
    elif isinstance(action, (int, np.integer)) and not isinstance(action, bool):
        text = str(int(action))
    else:
        return None
    if len(text) > limit:
        return None
    if not text.isascii():
        text = text.encode("utf-8", errors="replace").decode("utf-8")
    return text


def normalize(text: str) -> str:
    """Lower-cased and stripped of whitespace, quotes, brackets and a final period."""
    return text.strip().strip("'\"`").strip().strip("[]().").strip().lower()


def shorten(text: str | None, limit: int = 40) -> str:
    """A short printable preview of an action for error notes."""
    if text is None:
        return "<not text>"
    text = clean_text(text, limit + 1)
    return text if len(text) <= limit else text[:limit] + "..."


class TextEnv(gym.Env):
    """Base of single-agent text environments: a ``gymnasium.Env`` with text spaces.

    Subclasses implement ``reset`` and ``step`` with Gymnasium's exact signatures and ``_render``.
    ``group_by_seed`` tells the runner that the same seed gives the same task (so episodes with
    one seed form one group for group-relative baselines).
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}
    group_by_seed = True

    def __init__(self, render_mode: str | None = None, max_obs_chars: int = 4096,
                 max_action_chars: int = 256) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        self.max_obs_chars = max_obs_chars
        self.observation_space = text_space(max_obs_chars)
        # Sampled actions stay short; any text is accepted by step() and judged there.
        self.action_space = text_space(max_action_chars)

    def reset(self, *, seed: int | None = None,  # type: ignore[override]
              options: dict[str, Any] | None = None) -> None:
        """Gymnasium's seeding (subclasses call it first), with the generator built from
        ``seed`` on first use: an episode whose task is given (``options``) never pays for one
        (8 us, a few % of a small model's step at 256 episodes)."""
        if seed is not None:
            if not (isinstance(seed, int) and seed >= 0):
                seeding.np_random(seed)  # gymnasium's error for a bad seed, at reset
            self._np_random, self._np_random_seed = None, seed

    @property
    def np_random(self) -> np.random.Generator:
        """Gymnasium's generator; the same stream as ``seeding.np_random(seed)`` at reset."""
        if self._np_random is None:
            self._np_random, self._np_random_seed = seeding.np_random(self._np_random_seed)
        return self._np_random

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self._np_random, self._np_random_seed = value, -1  # gymnasium's setter

    def _obs(self, text: str) -> str:
        return clean_text(text, self.max_obs_chars)

    def render(self) -> str | None:  # type: ignore[override]
        """The current state as text (render_mode 'ansi'); None when render_mode is None."""
        if self.render_mode is None:
            return None
        return self._render()

    def _render(self) -> str:
        raise NotImplementedError


class MultiAgentEnv:
    """Base of turn-based multi-agent text environments (PettingZoo AEC-like, see module doc).

    A game subclass sets ``possible_agents`` and implements four hooks:

    - ``_reset(options)``: set up a new game and ``self.agent_selection``;
    - ``_observe(agent) -> str``: the agent's view;
    - ``_legal(agent) -> list[str] | None``: legal action strings (None: any text);
    - ``_apply(agent, move)``: play a parsed legal move, set ``self.rewards`` for this step, move
      ``agent_selection`` on, and call ``self._finish()`` when the game is over.

    ``_parse(agent, text)`` maps action text to a move (default: match a legal action string,
    case- and bracket-insensitively) and returns None when the text is not a legal action.
    ``observe_struct(agent)`` may return a structured view for scripted policies.

    Attributes:
        possible_agents: Agent names in seat order ("player_0", "player_1", ...).
        agents: Agents of the current game.
        agent_selection: The agent whose turn it is.
        rewards: Reward of each agent from the last ``step``.
        terminations / truncations: Per agent; the game is over when all are done.
        infos: Per agent; the agent to move has ``legal_actions``; ``invalid_action`` after step.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "name": "multi_agent_env"}
    possible_agents: list[str] = []
    group_by_seed = False
    zero_sum = False  # every game's returns sum to 0 (league configs then default to RAE)
    max_action_chars = MAX_ACTION_CHARS

    def __init__(self, render_mode: str | None = None) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        self.agents: list[str] = []
        self.agent_selection = ""
        self.rewards: dict[str, float] = {}
        self._cumulative_rewards: dict[str, float] = {}
        self.terminations: dict[str, bool] = {}
        self.truncations: dict[str, bool] = {}
        self.infos: dict[str, dict[str, Any]] = {}
        self._notes: dict[str, str] = {}
        self._seed: int | None = None
        self._rng: np.random.Generator | None = None
        self._done = True

    # ------------------------------------------------------------------ public API
    @property
    def np_random(self) -> np.random.Generator:
        """The env's generator, created lazily from the last reset seed (cheap for games that
        never draw a random number)."""
        if self._rng is None:
            self._rng = np.random.default_rng(self._seed)
        return self._rng

    @property
    def done(self) -> bool:
        """True when the game is over for every agent (or before the first reset)."""
        return self._done

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Starts a new game. The same seed (and options) reproduce the game exactly."""
        if seed is not None:
            self._seed, self._rng = int(seed), None
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self._notes = {}
        self._done = False
        self._reset(dict(options or {}))
        self._refresh_infos()

    def step(self, action: Any) -> None:
        """Plays ``action`` (text) for ``agent_selection``. Never raises on a bad action."""
        if self._done:
            raise RuntimeError("the game is over; call reset() before step()")
        agent = self.agent_selection
        for a in self.agents:
            self.rewards[a] = 0.0
        text = action_text(action, self.max_action_chars)
        move = self._parse(agent, text) if text is not None else None
        if move is None:
            self.infos[agent]["invalid_action"] = True
            self._notes[agent] = self._invalid_note(agent, text)
            return
        self._notes.pop(agent, None)
        self.infos[agent].pop("legal_actions", None)  # only the agent to move carries them
        self._cumulative_rewards[agent] = 0.0
        self._apply(agent, move)
        for a in self.agents:
            self._cumulative_rewards[a] += self.rewards[a]
        self._refresh_infos()
        self.infos[agent]["invalid_action"] = False

    def observe(self, agent: str) -> str:
        """The text observation of ``agent`` (what its policy is shown)."""
        note = self._notes.get(agent)
        obs = self._observe(agent)
        return f"{note}\n{obs}" if note else obs

    def legal_actions(self, agent: str) -> list[str] | None:
        """Legal action strings of ``agent`` now ([] when it is not its turn; None: free text)."""
        if self._done or agent != self.agent_selection:
            return []
        return self._legal(agent)

    def observe_struct(self, agent: str) -> Any:
        """A structured view of what ``agent`` may know, for scripted policies (None if absent)."""
        del agent
        return None

    def last(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """(observation, reward since its last move, terminated, truncated, info) of the agent to
        move, like PettingZoo's ``last()``."""
        a = self.agent_selection
        return (self.observe(a), self._cumulative_rewards[a], self.terminations[a],
                self.truncations[a], self.infos[a])

    def render(self) -> str | None:
        """The full state as text (render_mode 'ansi'); None when render_mode is None."""
        return None if self.render_mode is None else self._render()

    def close(self) -> None:
        """Releases resources (nothing for the built-in games)."""

    # ------------------------------------------------------------------ helpers for games
    def _finish(self, truncated: bool = False) -> None:
        """Ends the game for every agent (call from ``_apply`` after setting the final rewards)."""
        flags = self.truncations if truncated else self.terminations
        for a in self.agents:
            flags[a] = True
        self._done = True

    def _refresh_infos(self) -> None:
        if not self._done:
            info = self.infos[self.agent_selection]
            info["legal_actions"] = self._legal(self.agent_selection)

    def _invalid_note(self, agent: str, text: str | None) -> str:
        legal = self._legal(agent)
        hint = f" Legal actions: {', '.join(legal)}." if legal else ""
        return f"Invalid action {shorten(text)!r}.{hint}"

    def _parse(self, agent: str, text: str) -> Any:
        legal = self._legal(agent)
        if legal is None:
            return text if text.strip() else None
        key = normalize(text)
        for action in legal:
            if normalize(action) == key:
                return action
        return None

    # ------------------------------------------------------------------ hooks
    def _reset(self, options: dict[str, Any]) -> None:
        raise NotImplementedError

    def _observe(self, agent: str) -> str:
        raise NotImplementedError

    def _legal(self, agent: str) -> list[str] | None:
        raise NotImplementedError

    def _apply(self, agent: str, move: Any) -> None:
        raise NotImplementedError

    def _render(self) -> str:
        return self._observe(self.agent_selection)


class SingleAgentGame(MultiAgentEnv):
    """A single-agent ``gymnasium.Env`` seen through the multi-agent API (one agent: "agent").

    The episode runner plays every env through this shape. The wrapped env's step info is in
    ``infos["agent"]``; its ``invalid_action`` flag (when the env sets one) is kept.
    """

    possible_agents = ["agent"]

    def __init__(self, env: gym.Env) -> None:
        super().__init__(render_mode=None)
        self.env = env
        self.group_by_seed = bool(getattr(env.unwrapped, "group_by_seed", True))
        self._obs = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        super().reset(seed=seed, options=options)
        obs, info = self.env.reset(seed=seed, options=options)
        self._obs = obs if isinstance(obs, str) else str(obs)
        self.infos["agent"] = dict(info)
        self.agent_selection = "agent"

    def _reset(self, options: dict[str, Any]) -> None:
        self.agent_selection = "agent"

    def _legal(self, agent: str) -> list[str] | None:
        return self.infos.get(agent, {}).get("legal_actions")

    def step(self, action: Any) -> None:
        if self._done:
            raise RuntimeError("the episode is over; call reset() before step()")
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._obs = obs if isinstance(obs, str) else str(obs)
        self.rewards["agent"] = float(reward)
        self._cumulative_rewards["agent"] = float(reward)
        self.infos["agent"] = dict(info)
        self.infos["agent"].setdefault("invalid_action", False)
        if terminated or truncated:
            self._finish(truncated=bool(truncated) and not terminated)

    def observe(self, agent: str) -> str:
        return self._obs

    def legal_actions(self, agent: str) -> list[str] | None:
        return None if self._done else self.infos["agent"].get("legal_actions")

    def observe_struct(self, agent: str) -> Any:
        fn = getattr(self.env.unwrapped, "observe_struct", None)
        return fn() if callable(fn) else None

    def render(self) -> str | None:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
