"""Data types shared by scheduling, ratings, records and reports.

A :class:`Player` is one *rating identity*: a learning policy (its live, changing weights), a frozen
snapshot of a learner at one version, or a fixed opponent (scripted baseline, checkpoint). A
:class:`Match` seats players in a fixed order (``players[i]`` plays seat ``i``). A
:class:`MatchResult` is what the episode runner hands back for one match.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrt.core.errors import AgentrtError


class TournamentError(AgentrtError):
    """A tournament is set up or driven wrongly (unknown player, bad state, bad result)."""


@dataclass(frozen=True)
class Player:
    """One participant of a match.

    Attributes:
        policy_id: The policy whose weights play (for a snapshot: the learner it was taken from).
        version: Weight version; for a learner the version when the match was scheduled, for a
            snapshot the frozen version. Scripted baselines use 0.
        learning: True for a live learning policy: its turns are trained on. Snapshots and fixed
            opponents are never trained.
        snapshot: True for a frozen copy of a learner at ``version``.
    """

    policy_id: str
    version: int = 0
    learning: bool = False
    snapshot: bool = False

    def __post_init__(self) -> None:
        if self.learning and self.snapshot:
            raise TournamentError(f"player {self.policy_id!r} cannot be learning and a snapshot")
        if "@" in self.policy_id or "|" in self.policy_id:
            raise TournamentError(f"policy id {self.policy_id!r} must not contain '@' or '|'")

    @property
    def key(self) -> str:
        """Rating identity: ``"lm"`` for a learner or fixed policy, ``"lm@3"`` for a snapshot."""
        return f"{self.policy_id}@{self.version}" if self.snapshot else self.policy_id

    def to_dict(self) -> dict[str, Any]:
        return {"policy_id": self.policy_id, "version": self.version,
                "learning": self.learning, "snapshot": self.snapshot}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Player:
        return cls(**data)


@dataclass(frozen=True)
class Entrant:
    """A policy entered into a tournament (the input of :func:`build_scheduler`).

    Attributes:
        policy_id: Policy id as in the run config.
        learning: Whether the run trains this policy.
        league_role: Only read by the league format: "main", "main_exploiter" or
            "league_exploiter" for learners; fixed entrants join the pool of opponents.
        roles: Agent names (seats) this entrant may play, e.g. ``("player_0",)`` for the
            first mover only; None: any seat of any env. Snapshots of a learner inherit its
            roles. A role that no env has is an error when the scheduler is built.
    """

    policy_id: str
    learning: bool = False
    league_role: str = "main"
    roles: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.roles is None:
            return
        roles = (self.roles,) if isinstance(self.roles, str) else tuple(self.roles)
        if not roles or not all(isinstance(r, str) and r for r in roles):
            raise TournamentError(f"entrant {self.policy_id!r}: roles must name at least one "
                                  f"agent (got {self.roles!r}); use None for any seat")
        object.__setattr__(self, "roles", roles)

    def may_play(self, agent: str) -> bool:
        """Whether this entrant may sit in the seat of ``agent``."""
        return self.roles is None or agent in self.roles


@dataclass(frozen=True)
class Match:
    """One scheduled game.

    Attributes:
        match_id: Unique and deterministic for a given seed (``"m00000042"``); a resumed run
            re-issues the same ids, which makes record inserts idempotent.
        env: Environment name the game is played in.
        players: Seat order: ``players[i]`` plays seat ``i``, the env's agent
            ``possible_agents[i]`` (see ``Scheduler.seat_names``); one player per seat.
        round: Scheduler round (swiss/round-robin round, or the training step for self-play).
    """

    match_id: str
    env: str
    players: tuple[Player, ...]
    round: int = 0

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(p.key for p in self.players)

    def to_dict(self) -> dict[str, Any]:
        return {"match_id": self.match_id, "env": self.env, "round": self.round,
                "players": [p.to_dict() for p in self.players]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Match:
        players = tuple(Player.from_dict(p) for p in data["players"])
        return cls(match_id=data["match_id"], env=data["env"], players=players,
                   round=int(data.get("round", 0)))


@dataclass(frozen=True)
class MatchResult:
    """Outcome of one match, reported by the episode runner.

    Attributes:
        match: The match as scheduled.
        scores: Per seat, 1.0 win, 0.5 draw, 0.0 loss (any numbers work for n players: a higher
            score ranks better, equal scores tie).
        length: Game length in turns (all seats together).
        invalid_moves: Per seat, how many invalid moves that seat made.
        info: Free-form extras stored as JSON (termination reason, seeds, ...).
    """

    match: Match
    scores: tuple[float, ...]
    length: int = 0
    invalid_moves: tuple[int, ...] = ()
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.match.players)
        if len(self.scores) != n:
            raise TournamentError(
                f"match {self.match.match_id} has {n} seats but {len(self.scores)} scores"
            )
        if not self.invalid_moves:
            object.__setattr__(self, "invalid_moves", (0,) * n)
        elif len(self.invalid_moves) != n:
            raise TournamentError(
                f"match {self.match.match_id} has {n} seats but "
                f"{len(self.invalid_moves)} invalid-move counts"
            )


@dataclass(frozen=True)
class SnapshotEvent:
    """A snapshot the controller must materialize before the next matches.

    Attributes:
        player: The new frozen player (``snapshot=True``, ``version`` = learner's version now).
        reset: After saving it, reset the learner to its initial weights (league exploiters).
        dropped: Snapshots that left the pool; their weights may be freed.
    """

    player: Player
    reset: bool = False
    dropped: tuple[Player, ...] = ()
