"""A two-player bargaining game in natural language with a verifiable payoff.

A pool of items (books, hats, balls; 1-4 of each) must be split. Each player privately values the
item types so that the whole pool is worth 10 points to it. Players alternate free-text messages
(at most ``max_turns`` in all). A message may contain one bracketed move:

- ``[propose books=2 hats=1 balls=0]`` (or ``[propose 2 1 0]``): the speaker asks for these counts
  and offers the rest;
- ``[accept]``: accepts the other player's latest proposal, which ends the game.

Anything else is talk and is shown to the other player. Payoff: with a deal each player gets the
value of its share / 10 (so in [0, 1]); without a deal when the turns run out both get 0. An
empty message, a malformed or impossible proposal, or ``[accept]`` with nothing to accept is an
invalid action. ``observe_struct(agent)`` gives counts, own values and the standing offer.

Sides: the game is symmetric except for the move order. ``player_0`` opens (the first message,
usually the first proposal) and ``player_1`` answers; with one policy per side (roles) they are
called the buyer (``player_0``) and the seller (``player_1``) in docs and examples.

``compact=True`` gives the whole decision state in one short line for small LMs trained from
scratch (as ``TicTacToe(compact=True)``): ``"P3,1,2 V2,0,4 O1,0,2 T6"`` is the pool's counts,
the agent's values per item, the standing offer (what it gets by ``[accept]``; ``-`` when there
is none) and the messages left. Talk is not shown; moves are the same (``[propose 2 1 0]``).
"""

from __future__ import annotations

import re
from typing import Any

from agentrt.envs.core import MultiAgentEnv, clean_text

ITEMS = ("books", "hats", "balls")
TOTAL_VALUE = 10
_MOVE = re.compile(r"\[\s*(propose|accept)\b([^\]]*)\]", re.IGNORECASE)
_NAMED = re.compile(r"(books|hats|balls)\s*[=:]\s*(\d+)", re.IGNORECASE)


def _csv(numbers: tuple[int, ...]) -> str:
    return ",".join(str(n) for n in numbers)


def _random_values(rng: Any, counts: tuple[int, ...]) -> tuple[int, ...]:
    """Non-negative integer values per item type with sum(count * value) == TOTAL_VALUE."""
    while True:
        values = tuple(int(v) for v in rng.integers(0, TOTAL_VALUE + 1, size=len(counts)))
        if sum(c * v for c, v in zip(counts, values)) == TOTAL_VALUE:
            return values


class Bargain(MultiAgentEnv):
    """Two players split a pool of items by talking (see module docstring).

    Args:
        max_turns: Messages in all before the game ends without a deal.
        max_message_chars: Longer messages are cut to this many characters in the transcript.
        compact: Observe the decision state in one line (module docstring) instead of prose.
    """

    metadata = {"render_modes": ["ansi"], "name": "bargain"}
    possible_agents = ["player_0", "player_1"]

    def __init__(self, max_turns: int = 8, max_message_chars: int = 300, compact: bool = False,
                 render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        if max_turns < 2:
            raise ValueError(f"max_turns must be at least 2, got {max_turns}")
        self.max_turns = max_turns
        self.max_message_chars = max_message_chars
        self.compact = compact

    def _reset(self, options: dict[str, Any]) -> None:
        rng = self.np_random
        while True:
            counts = tuple(int(c) for c in rng.integers(1, 5, size=len(ITEMS)))
            if any(TOTAL_VALUE % c == 0 for c in counts):  # a valuation always exists
                break
        self.counts = counts
        self.values = {a: _random_values(rng, counts) for a in self.possible_agents}
        self.transcript: list[tuple[str, str]] = []
        self.offer: tuple[str, tuple[int, ...]] | None = None  # (proposer, proposer's share)
        self.deal: dict[str, tuple[int, ...]] | None = None
        self.agent_selection = "player_0"

    def _other(self, agent: str) -> str:
        return "player_1" if agent == "player_0" else "player_0"

    def _legal(self, agent: str) -> list[str] | None:
        return None  # free text

    def _parse(self, agent: str, text: str) -> Any:
        if not text.strip():
            return None
        match = _MOVE.search(text)
        if match is None:
            return ("talk", text, None)
        if match.group(1).lower() == "accept":
            has_offer = self.offer is not None and self.offer[0] != agent
            return ("accept", text, None) if has_offer else None
        share = self._parse_share(match.group(2))
        return ("propose", text, share) if share is not None else None

    def _parse_share(self, body: str) -> tuple[int, ...] | None:
        named = {k.lower(): int(v) for k, v in _NAMED.findall(body)}
        if named:
            if set(named) != set(ITEMS):
                return None
            share = tuple(named[k] for k in ITEMS)
        else:
            nums = re.findall(r"\d+", body)
            if len(nums) != len(ITEMS) or any(len(n) > 2 for n in nums):
                return None
            share = tuple(int(n) for n in nums)
        return share if all(0 <= s <= c for s, c in zip(share, self.counts)) else None

    def _apply(self, agent: str, move: Any) -> None:
        kind, text, share = move
        self.transcript.append((agent, clean_text(text.strip(), self.max_message_chars)))
        if kind == "propose":
            self.offer = (agent, share)
        elif kind == "accept":
            proposer, proposer_share = self.offer  # type: ignore[misc]
            rest = tuple(c - s for c, s in zip(self.counts, proposer_share))
            self.deal = {proposer: proposer_share, agent: rest}
            for a, got in self.deal.items():
                self.rewards[a] = self.payoff(a, got)
            self._finish()
            return
        if len(self.transcript) >= self.max_turns:
            self._finish()
        else:
            self.agent_selection = self._other(agent)

    def payoff(self, agent: str, share: tuple[int, ...]) -> float:
        """Value of ``share`` to ``agent``, divided by the value of the whole pool (10)."""
        return sum(s * v for s, v in zip(share, self.values[agent])) / TOTAL_VALUE

    def _offer_to(self, agent: str) -> tuple[int, ...] | None:
        if self.offer is None or self.offer[0] == agent:
            return None
        return tuple(c - s for c, s in zip(self.counts, self.offer[1]))

    def _observe(self, agent: str) -> str:
        if self.compact:
            offer = self._offer_to(agent)
            return (f"P{_csv(self.counts)} V{_csv(self.values[agent])} "
                    f"O{'-' if offer is None else _csv(offer)} "
                    f"T{self.max_turns - len(self.transcript)}")
        pool = ", ".join(f"{c} {k}" for c, k in zip(self.counts, ITEMS))
        vals = ", ".join(f"{k}={v}" for k, v in zip(ITEMS, self.values[agent]))
        talk = "\n".join(f"{'You' if a == agent else 'Other'}: {m}" for a, m in self.transcript)
        offer = self._offer_to(agent)
        standing = ("none" if offer is None else
                    " ".join(f"{k}={n}" for k, n in zip(ITEMS, offer)) + " for you")
        left = self.max_turns - len(self.transcript)
        return (f"Bargaining. Pool: {pool}. Your values per item: {vals} (pool worth 10).\n"
                f"Messages so far:\n{talk or '(none)'}\nStanding offer: {standing}. "
                f"Messages left: {left}.\nWrite a message; include "
                "[propose books=a hats=b balls=c] (what you take) or [accept].")

    def observe_struct(self, agent: str) -> dict[str, Any]:
        return {"counts": self.counts, "values": self.values[agent],
                "offer": self._offer_to(agent),
                "turns_left": self.max_turns - len(self.transcript)}

    def _render(self) -> str:
        lines = [f"{a}: {m}" for a, m in self.transcript]
        return "\n".join([f"pool {self.counts}, values {self.values}"] + lines)
