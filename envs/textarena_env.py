"""TextArena games through the turn-based text API (optional extra ``games``: ``textarena``).

``make("TextArena-v0", env_id="TicTacToe-v0", num_players=2)`` wraps ``textarena.make(env_id)``.
TextArena keeps its own rules for bad moves (an error allowance, then the offender loses); the
adapter reports each move TextArena rejected as ``infos[agent]["invalid_action"] = True`` so the
runner counts it. TextArena gives no list of legal actions, so ``legal_actions`` is None (free
text). The observation of an agent is what TextArena returns for it on its turn (TextArena's
default wrappers format it as text; a fresh TextArena env is built on every reset because its
wrappers keep history across resets). Rewards come from ``env.close()`` when the game ends.
"""

from __future__ import annotations

from typing import Any

import textarena as ta

from agentrt.envs.core import MultiAgentEnv


def _as_text(obs: Any) -> str:
    if isinstance(obs, str):
        return obs
    if isinstance(obs, list):  # raw envs: [(from_id, message, type), ...]
        return "\n".join(f"[{item[0]}] {item[1]}" if isinstance(item, tuple) else str(item)
                         for item in obs)
    return str(obs)


class TextArenaEnv(MultiAgentEnv):
    """A TextArena game as a :class:`MultiAgentEnv`.

    Args:
        env_id: TextArena id ("TicTacToe-v0", "KuhnPoker-v0", "ConnectFour-v0", ...).
        num_players: Players TextArena's ``reset`` is asked for.
        kwargs: Passed to ``textarena.make``.
    """

    metadata = {"render_modes": ["ansi"], "name": "textarena"}

    def __init__(self, env_id: str = "TicTacToe-v0", num_players: int = 2,
                 kwargs: dict[str, Any] | None = None, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        self.env_id = env_id
        self.ta_kwargs = dict(kwargs or {})
        self.ta_env = ta.make(env_id, **self.ta_kwargs)
        self.possible_agents = [f"player_{i}" for i in range(num_players)]
        self.metadata = {**self.metadata, "name": f"textarena/{env_id}"}
        self._views: dict[str, str] = {}

    def _reset(self, options: dict[str, Any]) -> None:
        seed = int(self.np_random.integers(2**31 - 1)) if self._seed is not None else None
        # TextArena's observation wrappers keep history across resets: build a fresh env.
        self.ta_env = ta.make(self.env_id, **self.ta_kwargs)
        self.ta_env.reset(num_players=len(self.possible_agents), seed=seed)
        self._views = {}
        self._pull()

    def _pull(self) -> None:
        pid, obs = self.ta_env.get_observation()
        self.agent_selection = f"player_{pid}"
        self._views[self.agent_selection] = _as_text(obs)

    def _legal(self, agent: str) -> list[str] | None:
        return None

    def _errors(self) -> int:
        return int(getattr(getattr(self.ta_env, "state", None), "error_count", 0) or 0)

    def step(self, action: Any) -> None:
        """Plays ``action``; flags it invalid when TextArena rejected it."""
        agent = self.agent_selection
        before = self._errors()
        super().step(action)
        if self.infos[agent].get("invalid_action") is False:
            state = getattr(self.ta_env, "state", None)
            info = getattr(state, "game_info", {}).get(int(agent.rsplit("_", 1)[1]), {})
            self.infos[agent]["invalid_action"] = (self._errors() > before
                                                   or bool(info.get("invalid_move")))

    def _parse(self, agent: str, text: str) -> str | None:
        return text if text.strip() else None

    def _apply(self, agent: str, move: str) -> None:
        done, _ = self.ta_env.step(move)
        if done:
            rewards, game_info = self.ta_env.close()
            for pid, r in (rewards or {}).items():
                self.rewards[f"player_{pid}"] = float(r)
            self.infos[agent]["game_info"] = game_info
            self._finish()
        else:
            self._pull()

    def _observe(self, agent: str) -> str:
        return self._views.get(agent, "")

    def _render(self) -> str:
        return self._views.get(self.agent_selection, "")
