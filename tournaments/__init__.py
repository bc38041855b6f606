"""Tournaments: match scheduling, ratings, match records and reports (see docs/tournaments.md).

The controller builds a scheduler from :class:`ScheduleConfig` with :func:`build_scheduler`,
plays the matches it issues, stores results in a :class:`MatchStore`, feeds them to the
scheduler and to the ratings, and writes the HTML report with :func:`write_report`. A match
has one player per seat of its env (the env's agents, :func:`resolve_seats`); ``Entrant.roles``
pins an entrant to some seats. The
role-conditioned advantage estimator lives in :mod:`agentrt.algos.rae`.
"""

from agentrt.tournaments.config import (
    SCHEDULERS,
    LeagueConfig,
    ScheduleConfig,
    SnapshotConfig,
    build_scheduler,
)
from agentrt.tournaments.league import League, LeagueOptions
from agentrt.tournaments.ratings import (
    ALL,
    BTFit,
    EloRatings,
    OpenSkillRatings,
    RatingRow,
    WinMatrix,
    fit_bradley_terry,
    kendall_tau,
    rated_view,
)
from agentrt.tournaments.records import MatchStore
from agentrt.tournaments.report import (
    LeaderRow,
    build_leaderboard,
    format_leaderboard,
    write_report,
)
from agentrt.tournaments.scheduling import (
    PFSP_WEIGHTINGS,
    Group,
    RoundRobin,
    Scheduler,
    SeatBalancer,
    WinRates,
    load_state,
    pfsp_probs,
    save_state,
)
from agentrt.tournaments.selfplay import (
    PFSP,
    Lagged,
    Mirror,
    SelfPlayScheduler,
    SnapshotRule,
    UniformFSP,
)
from agentrt.tournaments.seating import resolve_seats, seat_assignment
from agentrt.tournaments.session import Tournament
from agentrt.tournaments.swiss import Swiss
from agentrt.tournaments.types import (
    Entrant,
    Match,
    MatchResult,
    Player,
    SnapshotEvent,
    TournamentError,
)

__all__ = [
    "SCHEDULERS", "LeagueConfig", "ScheduleConfig", "SnapshotConfig", "build_scheduler",
    "League", "LeagueOptions", "ALL", "BTFit", "EloRatings", "OpenSkillRatings", "RatingRow",
    "WinMatrix", "fit_bradley_terry", "kendall_tau", "rated_view", "MatchStore", "LeaderRow",
    "build_leaderboard", "format_leaderboard", "write_report", "PFSP_WEIGHTINGS", "RoundRobin",
    "Group", "Scheduler", "SeatBalancer", "WinRates", "load_state", "pfsp_probs", "save_state",
    "resolve_seats", "seat_assignment", "PFSP",
    "Lagged", "Mirror", "SelfPlayScheduler", "SnapshotEvent", "SnapshotRule", "UniformFSP",
    "Swiss", "Tournament", "Entrant", "Match", "MatchResult", "Player", "TournamentError",
]
