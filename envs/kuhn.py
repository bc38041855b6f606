"""Kuhn poker: the smallest poker with hidden information (Kuhn 1950; OpenSpiel's ``kuhn_poker``).

Three cards J < Q < K; each player antes 1 chip and gets one card the other cannot see. Actions
are "pass" (check, or fold facing a bet) and "bet" (bet 1, or call). Sequences: pass-pass and
bet-call / pass-bet-call go to showdown (higher card wins 1 / 2 chips); a fold loses the ante.
The returns are zero-sum and equal OpenSpiel's for the same deal and actions.

``reset(options={"deal": (card_0, card_1)})`` fixes the deal (cards 0=J, 1=Q, 2=K); otherwise it
is drawn from the seed. ``observe_struct(agent)`` is ``{"card": int, "history": "pb..."}`` and
``info_state(agent)`` is OpenSpiel's information-state string (e.g. "2pb").
"""

from __future__ import annotations

from typing import Any

from agentrt.envs.core import MultiAgentEnv

CARDS = "JQK"
_TERMINAL = {"pp", "bp", "bb", "pbp", "pbb"}


class KuhnPoker(MultiAgentEnv):
    """Two-player Kuhn poker through the turn-based text API (see module docstring)."""

    metadata = {"render_modes": ["ansi"], "name": "kuhn_poker"}
    possible_agents = ["player_0", "player_1"]
    zero_sum = True

    def _reset(self, options: dict[str, Any]) -> None:
        deal = options.get("deal")
        if deal is None:
            perm = self.np_random.permutation(3)
            deal = (int(perm[0]), int(perm[1]))
        if len(deal) != 2 or deal[0] == deal[1] or not all(c in (0, 1, 2) for c in deal):
            raise ValueError(f"deal must be two different cards among 0, 1, 2; got {deal!r}")
        self.cards = (int(deal[0]), int(deal[1]))
        self.history = ""
        self.agent_selection = "player_0"

    def _legal(self, agent: str) -> list[str] | None:
        return ["pass", "bet"]

    def _apply(self, agent: str, move: str) -> None:
        self.history += move[0]
        if self.history in _TERMINAL:
            self._payout()
            self._finish()
        else:
            self.agent_selection = "player_1" if agent == "player_0" else "player_0"

    def _payout(self) -> None:
        h = self.history
        if h == "bp":
            winner, stake = 0, 1
        elif h == "pbp":
            winner, stake = 1, 1
        else:
            winner = 0 if self.cards[0] > self.cards[1] else 1
            stake = 2 if "b" in h else 1
        self.rewards[f"player_{winner}"] = float(stake)
        self.rewards[f"player_{1 - winner}"] = -float(stake)

    def _seat(self, agent: str) -> int:
        return int(agent[-1])

    def _observe(self, agent: str) -> str:
        card = CARDS[self.cards[self._seat(agent)]]
        moves = ", ".join("pass" if m == "p" else "bet" for m in self.history) or "none"
        return (f"Kuhn poker (cards J < Q < K, ante 1). You are {agent}; your card is {card}.\n"
                f"Actions so far: {moves}.\nReply 'pass' (check/fold) or 'bet' (bet/call).")

    def observe_struct(self, agent: str) -> dict[str, Any]:
        return {"card": self.cards[self._seat(agent)], "history": self.history}

    def info_state(self, agent: str) -> str:
        """OpenSpiel's information-state string of ``agent``: its card digit, then the history."""
        return f"{self.cards[self._seat(agent)]}{self.history}"

    def _render(self) -> str:
        return f"cards {CARDS[self.cards[0]]} {CARDS[self.cards[1]]}, history '{self.history}'"
