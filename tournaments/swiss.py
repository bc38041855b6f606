"""Swiss system: each round groups entrants of similar score who have not met yet.

A group has one entrant per seat of the round's env: pairs for two-player games, triples for
three-player games, a single entrant for one-player tasks. Scoring: each seat's score is added
to its entrant's points (1 for a win, 0.5 for a draw). Entrants left over when the field does not
split into groups get a bye worth 1 point (FIDE handbook C.04, "bye: one point"), at most once
per player while possible (lowest-ranked first). Grouping: standings sorted by score (random
tie-break from the scheduler's RNG), then a depth-first search groups the top entrant with the
nearest-ranked ones it has not met in exactly this group, backtracking when the rest cannot be
grouped; only if no rematch-free grouping exists (more rounds than opponents) do rematches
happen, each entrant joining the ones it has met least (pairwise). For two seats this is the
classic swiss pairing.

Envs: when the envs are interchangeable (same seat count, no roles) each group cycles through
them; otherwise round ``r`` is played in env ``envs[r % len(envs)]``, only entrants whose roles
include a seat of it take part, and groups must be seatable with their roles: an entrant no
group can seat sits the round out with a bye.

A round is only paired once every match of the previous round has been reported, so
:meth:`Swiss.next_matches` returns fewer matches than asked (or none) while results are pending.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from agentrt.tournaments.scheduling import Group, RatedFormat, load_queue
from agentrt.tournaments.seating import feasible_groups
from agentrt.tournaments.types import Entrant, Match, MatchResult

_SEARCH_LIMIT = 20000  # DFS nodes before falling back to greedy grouping with rematches


class Swiss(RatedFormat):
    """Swiss-system tournament.

    Args:
        rounds: Number of rounds; None uses ceil(log2(N)), enough to separate a unique winner.
        games_per_pairing: Games each group plays per round; 2 plays both seat orders of a pair.
        seats: Agent names per env (see :class:`Scheduler`).
    """

    name = "swiss"

    def __init__(self, entrants: Sequence[Entrant], envs: Sequence[str], seed: int = 0,
                 rounds: int | None = None, games_per_pairing: int = 2,
                 seats: Mapping[str, Sequence[str]] | None = None) -> None:
        super().__init__(entrants, envs, seed, rounds, games_per_pairing, seats)
        if rounds is None:
            self.rounds = max(1, math.ceil(math.log2(len(entrants))))
        self.scores: dict[str, float] = {e.policy_id: 0.0 for e in entrants}
        self.met: dict[str, int] = {}  # "a|b|.." (sorted) -> times this exact group met
        self.byes: list[str] = []
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

    def _next_groups(self, n: int) -> list[Group]:
        if not self._queue and not self._pending and self.round < self.rounds:
            self._pair_round()
        take, self._queue = self._queue[:n], self._queue[n:]
        return [Group(tuple(self.current(i) for i in ids), env) for ids, env in take]

    def _pair_round(self) -> None:
        env = None if self.uniform else self.envs[self.round % len(self.envs)]
        n, allowed = self._seat_count(env), self._allowed_fn(env)
        ids = self._eligible(env)
        tie = self.rng.permutation(len(ids))
        order = sorted(range(len(ids)), key=lambda i: (-self.scores[ids[i]], tie[i]))
        ranked = [ids[i] for i in order]
        byes: list[str] = []
        if all(len(allowed(i)) == n for i in ranked):  # no roles: len % n byes, bottom first
            for _ in range(len(ranked) % n):
                byes.append(self._pick_bye([r for r in ranked if r not in byes]))
        else:  # roles: whoever the greedy grouping cannot seat takes a bye
            byes = self._group_greedy(ranked, n, allowed)[1]
        ranked = [r for r in ranked if r not in byes]
        groups = self._group_without_rematch(ranked, n, allowed)
        if groups is None:
            groups, left = self._group_greedy(ranked, n, allowed)
            byes += left
        for pid in byes:
            self._give_bye(pid)
        for g in groups:
            tag = "|".join(sorted(g))
            self.met[tag] = self.met.get(tag, 0) + 1
        self._queue = [(g, env) for g in groups for _ in range(self.games_per_pairing)]
        self.round += 1

    def _give_bye(self, pid: str) -> None:
        self.byes.append(pid)
        self.scores[pid] += 1.0

    def _pick_bye(self, ranked: list[str]) -> str:
        for pid in reversed(ranked):
            if pid not in self.byes:
                return pid
        return ranked[-1]

    def _met(self, group: Sequence[str]) -> int:
        return self.met.get("|".join(sorted(group)), 0) if len(group) > 1 else 0

    def _group_without_rematch(self, ranked: list[str], n: int,
                               allowed: Callable[[str], Any]) -> list[tuple[str, ...]] | None:
        budget = [_SEARCH_LIMIT]

        def search(rest: list[str]) -> list[tuple[str, ...]] | None:
            if not rest:
                return []
            budget[0] -= 1
            if budget[0] < 0:
                return None
            for group in feasible_groups(rest[0], rest[1:], n, allowed):
                if self._met(group):
                    continue
                tail = search([x for x in rest if x not in group])
                if tail is not None:
                    return [group] + tail
            return None

        return search(ranked)

    def _group_greedy(self, ranked: list[str], n: int, allowed: Callable[[str], Any]
                      ) -> tuple[list[tuple[str, ...]], list[str]]:
        """Top entrant with the ones it met least (pairwise), rank order among equals; returns
        the groups and the entrants no group could seat."""
        met = self._pair_meetings()
        rest, groups, left = list(ranked), [], []
        while rest:
            a = rest.pop(0)
            pool = sorted(rest, key=lambda x: met.get("|".join(sorted((a, x))), 0))
            group = next(feasible_groups(a, pool, n, allowed), None)
            if group is None:
                left.append(a)
                continue
            groups.append(group)
            rest = [x for x in rest if x not in group]
        return groups, left

    def _pair_meetings(self) -> dict[str, int]:
        """"a|b" -> games of a group holding both (for two seats: ``met`` itself)."""
        out: dict[str, int] = {}
        for tag, count in self.met.items():
            ids = tag.split("|")
            for i in range(len(ids)):
                for j in range(i + 1, len(ids)):
                    pair = f"{ids[i]}|{ids[j]}"
                    out[pair] = out.get(pair, 0) + count
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "scores": dict(self.scores), "met": dict(self.met),
                "byes": list(self.byes), "queue": [[list(g), env] for g, env in self._queue],
                "pending": [m.to_dict() for m in self._pending.values()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.scores = {k: float(v) for k, v in state["scores"].items()}
        self.met = {k: int(v) for k, v in state["met"].items()}
        self.byes = list(state["byes"])
        self._queue = load_queue(state["queue"])
        self._pending = {d["match_id"]: Match.from_dict(d) for d in state["pending"]}
