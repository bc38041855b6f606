"""Kuhn poker: the smallest poker with hidden information (Kuhn 1950; OpenSpiel's ``kuhn_poker``).

Two players (``KuhnPoker-v0``): three cards J < Q < K; each player antes 1 chip and gets one card
the others cannot see. Actions are "pass" (check, or fold facing a bet) and "bet" (bet 1, or
call). Sequences: pass-pass and bet-call / pass-bet-call go to showdown (higher card wins 1 / 2
chips); a fold loses the ante. The returns are zero-sum and equal OpenSpiel's for the same deal
and actions.

Three players (``KuhnPoker3-v0``, ``players=3``): OpenSpiel's N-player generalisation with four
cards J < Q < K < A. Players act in seat order; if nobody bets in the first round, the highest
card takes the pot (+2, the others -1). After the first bet, every other player acts once more
in turn (call or fold) and the highest card among those who put in a bet wins the pot.

``reset(options={"deal": (card_0, card_1, ...)})`` fixes the deal (cards 0=J, 1=Q, 2=K, 3=A);
otherwise it is drawn from the seed. ``observe_struct(agent)`` is ``{"card": int,
"history": "pb..."}`` and ``info_state(agent)`` is OpenSpiel's information-state string (e.g.
"2pb").
"""

from __future__ import annotations

from typing import Any

from agentrt.envs.core import MultiAgentEnv

CARDS = "JQKA"


class KuhnPoker(MultiAgentEnv):
    """N-player Kuhn poker through the turn-based text API (see module docstring).

    Args:
        players: 2 (three cards) or 3 (four cards).
        compact: Observe "K|pb" (the own card, then the moves so far: p pass, b bet) instead
            of the sentence; the card is the prompt's first byte.
    """

    metadata = {"render_modes": ["ansi"], "name": "kuhn_poker"}
    possible_agents = ["player_0", "player_1"]
    zero_sum = True

    def __init__(self, players: int = 2, compact: bool = False,
                 render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        if players not in (2, 3):
            raise ValueError(f"players must be 2 or 3, got {players}")
        self.players = players
        self.compact = compact
        self.possible_agents = [f"player_{i}" for i in range(players)]
        self.cards_in_deck = players + 1

    def _reset(self, options: dict[str, Any]) -> None:
        n = self.players
        deal = options.get("deal")
        if deal is None:
            perm = self.np_random.permutation(self.cards_in_deck)
            deal = tuple(int(c) for c in perm[:n])
        if (len(deal) != n or len(set(deal)) != n
                or not all(c in range(self.cards_in_deck) for c in deal)):
            raise ValueError(f"deal must be {n} different cards among 0..{n}; got {deal!r}")
        self.cards = tuple(int(c) for c in deal)
        self.history = ""
        self.agent_selection = "player_0"

    def _legal(self, agent: str) -> list[str] | None:
        return ["pass", "bet"]

    def _apply(self, agent: str, move: str) -> None:
        self.history += move[0]
        n, first_bet = self.players, self.history.find("b")
        # Nobody bet in the first round, or everyone after the first bettor has answered it.
        if len(self.history) == (n if first_bet < 0 else n + first_bet):
            self._payout()
            self._finish()
        else:
            self.agent_selection = f"player_{len(self.history) % n}"

    def _payout(self) -> None:
        n = self.players
        bet = [any(m == "b" for m in self.history[p::n]) for p in range(n)]
        contenders = [p for p in range(n) if bet[p]] or list(range(n))
        winner = max(contenders, key=lambda p: self.cards[p])
        stake = [1 + int(b) for b in bet]  # ante, plus the bet or call
        for p in range(n):
            won = sum(stake) - stake[p] if p == winner else -stake[p]
            self.rewards[f"player_{p}"] = float(won)

    def _seat(self, agent: str) -> int:
        return int(agent.rsplit("_", 1)[1])

    def _observe(self, agent: str) -> str:
        card = CARDS[self.cards[self._seat(agent)]]
        if self.compact:  # "K|pb": the card, then the moves so far (p pass, b bet)
            return f"{card}|{self.history}"
        moves = ", ".join("pass" if m == "p" else "bet" for m in self.history) or "none"
        ranks = " < ".join(CARDS[:self.cards_in_deck])
        return (f"Kuhn poker (cards {ranks}, ante 1). You are {agent}; your card is {card}.\n"
                f"Actions so far: {moves}.\nReply 'pass' (check/fold) or 'bet' (bet/call).")

    def observe_struct(self, agent: str) -> dict[str, Any]:
        return {"card": self.cards[self._seat(agent)], "history": self.history}

    def info_state(self, agent: str) -> str:
        """OpenSpiel's information-state string of ``agent``: its card digit, then the history."""
        return f"{self.cards[self._seat(agent)]}{self.history}"

    def _render(self) -> str:
        return f"cards {' '.join(CARDS[c] for c in self.cards)}, history '{self.history}'"
