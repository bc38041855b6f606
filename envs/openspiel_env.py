"""OpenSpiel games through the turn-based text API (needs the ``open-spiel`` package).

``make("OpenSpiel-v0", game="kuhn_poker")`` loads any sequential OpenSpiel game (perfect or
imperfect information, with chance nodes). Agents are "player_0".."player_{n-1}". Chance nodes
are sampled from the env's seeded generator, or forced with
``reset(options={"chance_actions": [2, 0]})`` (used in order, then sampling resumes).

Observation: the information-state string when the game provides one (so hidden information
stays hidden), else the observation string, followed by the legal actions. Actions are OpenSpiel's
action strings (``state.action_to_string``, matched case-insensitively) or the integer action id.
Rewards are ``state.rewards()`` after each move; the returns equal ``state.returns()``.
"""

from __future__ import annotations

from typing import Any

import pyspiel

from agentrt.envs.core import MultiAgentEnv, normalize


class OpenSpielEnv(MultiAgentEnv):
    """An OpenSpiel game as a :class:`MultiAgentEnv`.

    Args:
        game: OpenSpiel short name ("kuhn_poker", "tic_tac_toe", "leduc_poker", ...).
        params: Game parameters passed to ``pyspiel.load_game``.
    """

    metadata = {"render_modes": ["ansi"], "name": "openspiel"}

    def __init__(self, game: str = "tic_tac_toe", params: dict[str, Any] | None = None,
                 render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        self.game = pyspiel.load_game(game, params or {})
        gtype = self.game.get_type()
        if gtype.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
            raise ValueError(f"OpenSpiel game {game!r} is not turn-based; only sequential games "
                             "are supported")
        self.game_name = game
        self.possible_agents = [f"player_{i}" for i in range(self.game.num_players())]
        self.metadata = {**self.metadata, "name": f"openspiel/{game}"}
        self._use_info_state = gtype.provides_information_state_string
        self.state: Any = None

    def _reset(self, options: dict[str, Any]) -> None:
        self.state = self.game.new_initial_state()
        self._forced = list(options.get("chance_actions", []))
        self._advance_chance()
        self._select()

    def _advance_chance(self) -> None:
        while self.state.is_chance_node():
            outcomes = self.state.chance_outcomes()
            if self._forced:
                action = int(self._forced.pop(0))
                if action not in [a for a, _ in outcomes]:
                    raise ValueError(f"chance action {action} is not possible here; possible: "
                                     f"{[a for a, _ in outcomes]}")
            else:  # inverse-CDF sampling: much cheaper than Generator.choice for a few outcomes
                u, acc, action = self.np_random.random(), 0.0, int(outcomes[-1][0])
                for a, p in outcomes:
                    acc += p
                    if u < acc:
                        action = int(a)
                        break
            self.state.apply_action(action)

    def _select(self) -> None:
        if self.state.is_terminal():
            self._finish()
        else:
            self.agent_selection = f"player_{self.state.current_player()}"

    def _player(self, agent: str) -> int:
        return int(agent.rsplit("_", 1)[1])

    def _legal_ids(self, agent: str) -> list[int]:
        return list(self.state.legal_actions(self._player(agent)))

    def _legal(self, agent: str) -> list[str] | None:
        p = self._player(agent)
        return [self.state.action_to_string(p, a) for a in self._legal_ids(agent)]

    def _parse(self, agent: str, text: str) -> int | None:
        ids = self._legal_ids(agent)
        core = text.strip().strip("[]").strip()
        if core.isdecimal() and len(core) < 10:
            return int(core) if int(core) in ids else None
        key = normalize(text)
        p = self._player(agent)
        for a in ids:
            if normalize(self.state.action_to_string(p, a)) == key:
                return a
        return None

    def _apply(self, agent: str, move: int) -> None:
        self.state.apply_action(move)
        self._advance_chance()
        for agent_name, r in zip(self.possible_agents, self.state.rewards()):
            self.rewards[agent_name] = float(r)
        self._select()

    def _observe(self, agent: str) -> str:
        p = self._player(agent)
        view = (self.state.information_state_string(p) if self._use_info_state
                else self.state.observation_string(p))
        legal = self.legal_actions(agent)
        tail = f"\nLegal actions: {', '.join(legal)}" if legal else ""
        return f"{self.game_name}, you are {agent}:\n{view}{tail}"

    def observe_struct(self, agent: str) -> dict[str, Any]:
        p = self._player(agent)
        return {"info_state": (self.state.information_state_string(p)
                               if self._use_info_state else None),
                "observation": self.state.observation_string(p)
                if self.game.get_type().provides_observation_string else None,
                "history": list(self.state.history())}

    def returns(self) -> dict[str, float]:
        """OpenSpiel's returns of every agent (final payoffs once the game is over)."""
        return {a: float(r) for a, r in zip(self.possible_agents, self.state.returns())}

    def _render(self) -> str:
        return str(self.state)
