"""Swiss system: each round pairs entrants of similar score who have not met yet.

Scoring: a match is worth 1 point to the winner, 0.5 to each side on a draw. A player left over in
an odd field gets a bye worth 1 point (FIDE handbook C.04, "bye: one point"), at most once per
player while possible. Pairing: standings sorted by score (random tie-break from the scheduler's
RNG), then a depth-first search pairs the top player with the nearest-ranked opponent it has not
met, backtracking when the rest cannot be paired; only if no rematch-free pairing exists (more
rounds than opponents) do rematches happen, least-played pairs first.

A round is only paired once every match of the previous round has been reported, so
:meth:`Swiss.next_matches` returns fewer matches than asked (or none) while results are pending.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from agentrt.tournaments.scheduling import Scheduler
from agentrt.tournaments.types import Entrant, Match, MatchResult, Player, TournamentError

_SEARCH_LIMIT = 20000  # DFS nodes before falling back to greedy pairing with rematches


class Swiss(Scheduler):
    """Swiss-system tournament.

    Args:
        rounds: Number of rounds; None uses ceil(log2(N)), enough to separate a unique winner.
        games_per_pairing: Games each pairing plays per round; 2 plays both seat orders.
    """

    name = "swiss"

    def __init__(self, entrants: Sequence[Entrant], envs: Sequence[str], seed: int = 0,
                 rounds: int | None = None, games_per_pairing: int = 2) -> None:
        super().__init__(entrants, envs, seed)
        if len(entrants) < 2:
            raise TournamentError("swiss needs at least two entrants")
        self.rounds = rounds if rounds is not None else max(1, math.ceil(math.log2(len(entrants))))
        self.games_per_pairing = games_per_pairing
        self.scores: dict[str, float] = {e.policy_id: 0.0 for e in entrants}
        self.met: dict[str, int] = {}  # "a|b" (sorted) -> pairings so far
        self.byes: list[str] = []
        self._queue: list[tuple[str, str]] = []
        self._pending: dict[str, Match] = {}

    @property
    def done(self) -> bool:
        return self.round >= self.rounds and not self._queue and not self._pending

    def standings(self) -> list[tuple[str, float]]:
        """(policy id, points) best first; ties keep entrant order."""
        ids = [e.policy_id for e in self.entrants]
        return sorted(((i, self.scores[i]) for i in ids), key=lambda t: -t[1])

    def next_matches(self, n: int) -> list[Match]:
        matches = super().next_matches(n)
        self._pending.update((m.match_id, m) for m in matches)
        return matches

    def in_flight(self) -> list[Match]:
        """Matches issued but not reported yet (replay these after a resume)."""
        return list(self._pending.values())

    def report(self, results: Sequence[MatchResult]) -> None:
        super().report(results)
        for r in results:
            if r.match.match_id not in self._pending:
                continue  # not a match of the current round (e.g. reported twice): ignore
            del self._pending[r.match.match_id]
            for player, score in zip(r.match.players, r.scores):
                self.scores[player.policy_id] += float(score)

    def _next_pairs(self, n: int) -> list[tuple[Player, Player]]:
        if not self._queue and not self._pending and self.round < self.rounds:
            self._pair_round()
        take, self._queue = self._queue[:n], self._queue[n:]
        return [(self.current(a), self.current(b)) for a, b in take]

    def _pair_round(self) -> None:
        ids = [e.policy_id for e in self.entrants]
        tie = self.rng.permutation(len(ids))
        order = sorted(range(len(ids)), key=lambda i: (-self.scores[ids[i]], tie[i]))
        ranked = [ids[i] for i in order]
        if len(ranked) % 2:
            bye = self._pick_bye(ranked)
            ranked.remove(bye)
            self.byes.append(bye)
            self.scores[bye] += 1.0
        pairs = self._pair_without_rematch(ranked) or self._pair_greedy(ranked)
        for a, b in pairs:
            tag = "|".join(sorted((a, b)))
            self.met[tag] = self.met.get(tag, 0) + 1
        self._queue = [p for p in pairs for _ in range(self.games_per_pairing)]
        self.round += 1

    def _pick_bye(self, ranked: list[str]) -> str:
        for pid in reversed(ranked):
            if pid not in self.byes:
                return pid
        return ranked[-1]

    def _met(self, a: str, b: str) -> int:
        return self.met.get("|".join(sorted((a, b))), 0)

    def _pair_without_rematch(self, ranked: list[str]) -> list[tuple[str, str]] | None:
        budget = [_SEARCH_LIMIT]

        def search(rest: list[str]) -> list[tuple[str, str]] | None:
            if not rest:
                return []
            budget[0] -= 1
            if budget[0] < 0:
                return None
            a = rest[0]
            for j in range(1, len(rest)):
                b = rest[j]
                if self._met(a, b):
                    continue
                tail = search(rest[1:j] + rest[j + 1:])
                if tail is not None:
                    return [(a, b)] + tail
            return None

        return search(ranked)

    def _pair_greedy(self, ranked: list[str]) -> list[tuple[str, str]]:
        rest, pairs = list(ranked), []
        while rest:
            a = rest.pop(0)
            j = min(range(len(rest)), key=lambda k: (self._met(a, rest[k]), k))
            pairs.append((a, rest.pop(j)))
        return pairs

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "scores": dict(self.scores), "met": dict(self.met),
                "byes": list(self.byes), "queue": [list(p) for p in self._queue],
                "pending": [m.to_dict() for m in self._pending.values()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.scores = {k: float(v) for k, v in state["scores"].items()}
        self.met = {k: int(v) for k, v in state["met"].items()}
        self.byes = list(state["byes"])
        self._queue = [(a, b) for a, b in state["queue"]]
        self._pending = {d["match_id"]: Match.from_dict(d) for d in state["pending"]}
