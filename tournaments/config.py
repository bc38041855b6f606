"""Config of the match schedule and the factory that builds a scheduler from it.

The tournament run config embeds :class:`ScheduleConfig` (YAML section ``schedule:``); the
controller calls :func:`build_scheduler` with the entrants and envs named elsewhere in the config.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Mapping, Sequence

from pydantic import Field, ValidationError, field_validator

from agentrt.core.schema import format_validation_error
from agentrt.core.errors import ConfigError
from agentrt.core.registry import Registry
from agentrt.core.schema import ConfigModel
from agentrt.tournaments.league import League, LeagueOptions
from agentrt.tournaments.psro import PSRO
from agentrt.tournaments.scheduling import RoundRobin, Scheduler
from agentrt.tournaments.selfplay import PFSP, Exploit, Lagged, Mirror, SnapshotRule, UniformFSP
from agentrt.tournaments.swiss import Swiss
from agentrt.tournaments.types import Entrant


class _Section(ConfigModel):
    """A section of a tournament config."""


class SnapshotConfig(_Section):
    every: int | None = Field(20, gt=0, description="Freeze a learner every N steps (null: never).")
    win_rate: float | None = Field(
        0.7, gt=0.0, lt=1.0, description="Freeze early once its lowest win rate exceeds this."
    )
    min_steps: int = Field(5, ge=1, description="Steps between two snapshots at least.")
    max_pool: int | None = Field(
        20, gt=0, description="Snapshots kept per learner, the oldest dropped (null: all; each "
                              "costs an adapter or a CPU copy and its share of every checkpoint)."
    )


class LeagueConfig(_Section):
    pfsp_prob: float = Field(0.5, ge=0.0, le=1.0, description="Main agents: PFSP branch share.")
    verification_prob: float = Field(
        0.15, ge=0.0, le=1.0, description="Main agents: share checking exploiters and forgetting."
    )
    selfplay_min_win_rate: float = Field(
        0.3, ge=0.0, le=1.0, description="Main plays a live main only above this win rate."
    )
    exploiter_min_win_rate: float = Field(
        0.1, ge=0.0, le=1.0, description="Main exploiter plays a live main only above this."
    )
    league_exploiter_reset_prob: float = Field(
        0.25, ge=0.0, le=1.0, description="Chance a league exploiter resets after a snapshot."
    )


class ScheduleConfig(_Section):
    format: str = Field(
        "pfsp", description="Match format: round_robin, swiss, mirror, lagged, fsp, pfsp, psro, "
        "league, exploit (see docs/tournaments.md), a format a plugin registered in SCHEDULERS, or "
        "'package.module:builder' (builder(cfg, entrants, envs, seed, seats) -> Scheduler).")
    rounds: int | None = Field(
        None, gt=0, description="round_robin/swiss: rounds (null: endless / ceil(log2 N))."
    )
    games_per_pairing: int = Field(
        2, gt=0, description="round_robin/swiss: games per group per round (2: both seatings of "
                             "a pair; N: each seat once for N-seat games).")
    lag: int = Field(1, gt=0, description="lagged: play the snapshot this many versions old.")
    pfsp_weighting: Literal["hard", "variance", "linear", "linear_capped"] = Field(
        "hard", description="pfsp: f(x) of the win rate x; hard (1-x)^p, variance x(1-x)."
    )
    pfsp_exponent: float = Field(2.0, gt=0.0, description="pfsp: p of the hard weighting.")
    psro_explore: float = Field(
        0.1, ge=0.0, le=1.0, description="psro: share of games against a uniformly drawn member "
                                         "(keeps the meta-game measured); the rest the mixture.")
    win_rate_decay: float = Field(
        0.99, gt=0.0, le=1.0, description="Per-game decay of the win-rate estimates (1: no decay)."
    )
    snapshot: SnapshotConfig = Field(default_factory=SnapshotConfig)
    league: LeagueConfig = Field(default_factory=LeagueConfig)

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        try:
            SCHEDULERS.get(value)  # imports a 'module:builder' once, here, before any work
        except KeyError as exc:
            raise ValueError(str(exc.args[0])) from None
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value


Seats = Mapping[str, Sequence[str]] | None  # env id -> agent names in seat order
Builder = Callable[[ScheduleConfig, Sequence[Entrant], Sequence[str], int, Seats], Scheduler]
SCHEDULERS: Registry[Builder] = Registry("match format")


def _rule(cfg: ScheduleConfig) -> SnapshotRule:
    s = cfg.snapshot
    return SnapshotRule(every=s.every, win_rate=s.win_rate, min_steps=s.min_steps,
                        max_pool=s.max_pool)


SCHEDULERS.add("round_robin", lambda c, e, v, s, seats: RoundRobin(
    e, v, s, rounds=c.rounds, games_per_pairing=c.games_per_pairing, seats=seats))
SCHEDULERS.add("swiss", lambda c, e, v, s, seats: Swiss(
    e, v, s, rounds=c.rounds, games_per_pairing=c.games_per_pairing, seats=seats))
SCHEDULERS.add("mirror", lambda c, e, v, s, seats: Mirror(
    e, v, s, snapshot=_rule(c), win_rate_decay=c.win_rate_decay, seats=seats))
SCHEDULERS.add("lagged", lambda c, e, v, s, seats: Lagged(
    e, v, s, lag=c.lag, win_rate_decay=c.win_rate_decay, seats=seats))
SCHEDULERS.add("fsp", lambda c, e, v, s, seats: UniformFSP(
    e, v, s, snapshot=_rule(c), win_rate_decay=c.win_rate_decay, seats=seats))
SCHEDULERS.add("pfsp", lambda c, e, v, s, seats: PFSP(
    e, v, s, snapshot=_rule(c), weighting=c.pfsp_weighting, exponent=c.pfsp_exponent,
    win_rate_decay=c.win_rate_decay, seats=seats))
SCHEDULERS.add("exploit", lambda c, e, v, s, seats: Exploit(
    e, v, s, win_rate_decay=c.win_rate_decay, seats=seats))
SCHEDULERS.add("psro", lambda c, e, v, s, seats: PSRO(
    e, v, s, snapshot=_rule(c), explore=c.psro_explore, win_rate_decay=c.win_rate_decay,
    seats=seats))
SCHEDULERS.add("league", lambda c, e, v, s, seats: League(
    e, v, s, snapshot=_rule(c), win_rate_decay=c.win_rate_decay,
    options=LeagueOptions(**c.league.model_dump()), seats=seats))


def build_scheduler(cfg: ScheduleConfig | dict[str, Any], entrants: Sequence[Entrant],
                    envs: Sequence[str], seed: int = 0, seats: Seats = None) -> Scheduler:
    """Builds the scheduler named by ``cfg.format``.

    Args:
        cfg: The ``schedule`` config (a dict is validated first).
        entrants: Policies taking part; ``learning`` marks those the run trains, ``roles`` the
            seats each may take.
        envs: Env ids the matches are played in.
        seed: Seed of the scheduler's RNG (record it with the run).
        seats: Agent names in seat order per env id (``{"Bargain-v0": ["player_0",
            "player_1"]}``); envs left out are read from the env registry
            (``make_multi(env_id).possible_agents``), unknown ids are two-seat games.

    Raises:
        ConfigError: ``cfg`` is a dict that does not validate.
        TournamentError: the format cannot run with these entrants (e.g. no learner for pfsp,
            roles naming no agent of any env, a seat nobody may take).
    """
    if isinstance(cfg, dict):
        try:
            cfg = ScheduleConfig.model_validate(cfg)
        except ValidationError as exc:
            raise ConfigError(f"invalid schedule: {format_validation_error(exc)}") from None
    return SCHEDULERS.get(cfg.format)(cfg, entrants, envs, seed, seats)
