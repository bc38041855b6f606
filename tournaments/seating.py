"""Seats: each env's agent names, which seats an entrant may take, and balanced seating.

An env with N agents (``possible_agents``, e.g. ``player_0, player_1``) has N seats; a match
seats one player per seat, ``players[i]`` in seat ``i``. An entrant's ``roles`` (agent names)
restrict the seats it and its snapshots may take; None allows every seat.

- :func:`resolve_seats` finds each env's agent names: the explicit ``seats`` mapping first, else
  the registered env's ``possible_agents`` (``agentrt.envs.make_multi(env_id)``, default
  arguments); an env id the registry does not know (synthetic games in tests and simulations)
  is a two-seat game ``player_0, player_1``.
- :func:`seat_assignment` decides whether a group of players can fill all seats at once given
  their roles (bipartite matching, Kuhn's augmenting paths).
- :func:`feasible_groups` lists groups that can fill an env's seats, in a fixed order.
- :class:`SeatBalancer` seats a group so each player takes each seat equally often.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

import numpy as np

from agentrt.tournaments.types import Player, TournamentError

DEFAULT_SEATS = ("player_0", "player_1")  # env ids the registry does not know
MAX_ENUMERATED_SEATS = 7  # up to 7! = 5040 seatings are compared exactly; above, rotations
_GROUP_SEARCH_LIMIT = 20000  # nodes of one group search before giving up


def resolve_seats(envs: Sequence[str], seats: Mapping[str, Sequence[str]] | None = None
                  ) -> dict[str, tuple[str, ...]]:
    """Agent names in seat order per env.

    Args:
        envs: Env ids of the tournament.
        seats: Explicit agent names per env id (others are looked up, see the module docstring).

    Raises:
        TournamentError: ``seats`` names an env that is not in ``envs``, lists no or repeated
            names, or an env cannot be built to read its agents.
    """
    given = dict(seats or {})
    extra = sorted(set(given) - set(envs))
    if extra:
        raise TournamentError(f"seats names envs {extra} that are not in the tournament's envs "
                              f"{list(envs)}")
    out = {}
    for env in envs:
        names = tuple(given[env]) if env in given else _registered_agents(env)
        if not names or len(set(names)) != len(names) or not all(
                isinstance(a, str) and a for a in names):
            raise TournamentError(f"seats of env {env!r} must be distinct agent names, "
                                  f"got {list(names)}")
        out[env] = names
    return out


def _registered_agents(env: str) -> tuple[str, ...]:
    from agentrt.envs.registration import ENVS, make_multi

    if env not in ENVS:
        return DEFAULT_SEATS
    try:
        game = make_multi(env)
    except Exception as exc:  # noqa: BLE001 - any failure means: tell us the seats instead
        raise TournamentError(f"cannot build env {env!r} to read its agents ({exc}); pass "
                              f"seats={{{env!r}: [agent names in seat order]}}") from None
    names = tuple(game.possible_agents)
    close = getattr(game, "close", None)
    if callable(close):
        close()
    return names


def seat_assignment(allowed: Sequence[Collection[int]], n_seats: int) -> list[int] | None:
    """A seat per player, no seat twice, each within the player's allowed seats.

    Args:
        allowed: Per player, the seat indices it may take.
        n_seats: Seats of the env (a group may be smaller than that while it is being built).

    Returns:
        ``seat[i]`` of player ``i``, or None when no such assignment exists.
    """
    if len(allowed) > n_seats:
        return None
    owner = [-1] * n_seats

    def place(i: int, seen: set[int]) -> bool:
        for s in sorted(allowed[i]):
            if s not in seen:
                seen.add(s)
                if owner[s] < 0 or place(owner[s], seen):
                    owner[s] = i
                    return True
        return False

    if not all(place(i, set()) for i in range(len(allowed))):
        return None
    seat = [0] * len(allowed)
    for s, i in enumerate(owner):
        if i >= 0:
            seat[i] = s
    return seat


def feasible_groups(first: str | None, pool: Sequence[str], n_seats: int,
                    allowed: Callable[[str], Collection[int]],
                    limit: int | None = _GROUP_SEARCH_LIMIT) -> Iterator[tuple[str, ...]]:
    """Groups of ``n_seats`` ids that can fill every seat, ``first`` (when given) in each.

    Members are taken from ``pool`` in its order (lexicographic over positions, like
    ``itertools.combinations``); branches whose partial group already cannot be seated are cut.
    The search stops after ``limit`` nodes (None: never), so a huge infeasible field ends
    quickly.
    """
    budget = [limit if limit is not None else float("inf")]
    start = (first,) if first is not None else ()

    def grow(group: tuple[str, ...], rest: int) -> Iterator[tuple[str, ...]]:
        if len(group) == n_seats:
            yield group
            return
        for k in range(rest, len(pool)):
            budget[0] -= 1
            if budget[0] < 0:
                return
            cand = group + (pool[k],)
            if seat_assignment([allowed(p) for p in cand], n_seats) is not None:
                yield from grow(cand, k + 1)

    if not start or seat_assignment([allowed(first)], n_seats) is not None:
        yield from grow(start, 0)


class SeatBalancer:
    """Seats groups so each player takes each seat equally often per (env, group of players).

    For each (env, group) it counts how often each player sat in each seat. A new game of the
    group takes, among the seatings the players' roles allow, the one whose players sat least in
    their seats so far (sum of the counts), at random among ties. For two players without roles
    this is: the first game at random, every later game gives seat 0 to whoever had it less.
    Groups above :data:`MAX_ENUMERATED_SEATS` compare only the cyclic rotations of one order.

    :meth:`pick_seat` balances one player's own seat per env (self-play with roles, where the
    learner's seat is chosen before its opponents).
    """

    def __init__(self) -> None:
        self._groups: dict[str, dict[str, list[int]]] = {}  # "env|k1|k2.." -> key -> per seat
        self._own: dict[str, list[int]] = {}  # "env|key" -> per seat

    def seat(self, env: str, players: Sequence[Player], allowed: Sequence[Collection[int]],
             rng: np.random.Generator) -> tuple[Player, ...]:
        """``players`` in seat order (``allowed[i]``: seats ``players[i]`` may take)."""
        n = len(players)
        tag = f"{env}|" + "|".join(sorted(p.key for p in players))
        table = self._groups.setdefault(tag, {})
        rows = {p.key: table.setdefault(p.key, [0] * n) for p in players}
        options = _seatings(players, allowed)
        if not options:
            raise TournamentError(f"players {[p.key for p in players]} cannot fill the {n} seats "
                                  f"of env {env!r} with their roles")
        cost = [sum(rows[p.key][i] for i, p in enumerate(o)) for o in options]
        ties = [o for o, c in zip(options, cost) if c == min(cost)]
        pick = ties[int(rng.integers(len(ties)))] if len(ties) > 1 else ties[0]
        for i, p in enumerate(pick):
            rows[p.key][i] += 1
        return pick

    def pick_seat(self, env: str, key: str, options: Sequence[int], n_seats: int,
                  rng: np.random.Generator) -> int:
        """The seat among ``options`` that ``key`` had least in ``env``, random among ties."""
        row = self._own.setdefault(f"{env}|{key}", [0] * n_seats)
        ties = [s for s in options if row[s] == min(row[t] for t in options)]
        seat = ties[int(rng.integers(len(ties)))] if len(ties) > 1 else ties[0]
        row[seat] += 1
        return seat

    def state_dict(self) -> dict[str, Any]:
        return {"groups": self._groups, "own": self._own}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "groups" not in state:  # two-seat format: "env|a|b" -> times a had seat 0 minus b
            state = {"groups": {tag: _from_lead(tag, int(lead)) for tag, lead in state.items()},
                     "own": {}}
        self._groups = {t: {k: [int(c) for c in v] for k, v in rows.items()}
                        for t, rows in state["groups"].items()}
        self._own = {t: [int(c) for c in v] for t, v in state["own"].items()}


def _from_lead(tag: str, lead: int) -> dict[str, list[int]]:
    _, a, b = tag.rsplit("|", 2)
    return {a: [max(lead, 0), max(-lead, 0)], b: [max(-lead, 0), max(lead, 0)]}


def _seatings(players: Sequence[Player], allowed: Sequence[Collection[int]]
              ) -> list[tuple[Player, ...]]:
    """Distinct seatings the roles allow, in a fixed order (permutations of the players sorted
    by key, descending: for two players the order earlier versions drew from)."""
    n = len(players)
    order = sorted(range(n), key=lambda i: players[i].key, reverse=True)
    if n <= MAX_ENUMERATED_SEATS:
        perms: Any = itertools.permutations(order)
    else:
        perms = [order[r:] + order[:r] for r in range(n)]
    seen: set[tuple[Player, ...]] = set()
    out = []
    for perm in perms:
        if all(seat in allowed[i] for seat, i in enumerate(perm)):
            seating = tuple(players[i] for i in perm)
            if seating not in seen:
                seen.add(seating)
                out.append(seating)
    if not out and n > MAX_ENUMERATED_SEATS:
        seat = seat_assignment(allowed, n)
        if seat is not None:
            by_seat = sorted(range(n), key=lambda i: seat[i])
            out.append(tuple(players[i] for i in by_seat))
    return out
