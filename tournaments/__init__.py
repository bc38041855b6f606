"""Tournaments: match scheduling, ratings, match records and reports (see docs/tournaments.md).

The controller builds a scheduler from :class:`ScheduleConfig` with :func:`build_scheduler`,
plays the matches it issues, stores results in a :class:`MatchStore`, feeds them to the
scheduler and to the ratings, and writes the HTML report with :func:`write_report`. A match
has one player per seat of its env (the env's agents, :func:`resolve_seats`); ``Entrant.roles``
pins an entrant to some seats. The
role-conditioned advantage estimator lives in :mod:`agentrt.algos.rae`.
"""

from agentrt.core.lazy import lazy_exports

# Loaded on first use, so the config modules import without matplotlib (reports) or SQLite.
__getattr__, __dir__, __all__ = lazy_exports(__name__, globals(), {
    "agentrt.tournaments.config": ("SCHEDULERS", "LeagueConfig", "ScheduleConfig",
                                   "SnapshotConfig", "build_scheduler"),
    "agentrt.tournaments.league": ("League", "LeagueOptions"),
    "agentrt.tournaments.ratings": ("ALL", "BTFit", "EloRatings", "OpenSkillRatings", "RatingRow",
                                    "WinMatrix", "fit_bradley_terry", "kendall_tau",
                                    "rated_view"),
    "agentrt.tournaments.records": ("MatchStore",),
    "agentrt.tournaments.report": ("LeaderRow", "build_leaderboard", "format_leaderboard",
                                   "write_report"),
    "agentrt.tournaments.scheduling": ("PFSP_WEIGHTINGS", "Group", "RoundRobin", "Scheduler",
                                       "SeatBalancer", "WinRates", "load_state", "pfsp_probs",
                                       "save_state"),
    "agentrt.tournaments.selfplay": ("PFSP", "Lagged", "Mirror", "SelfPlayScheduler",
                                     "SnapshotRule", "UniformFSP"),
    "agentrt.tournaments.seating": ("resolve_seats", "seat_assignment"),
    "agentrt.tournaments.session": ("Tournament",),
    "agentrt.tournaments.swiss": ("Swiss",),
    "agentrt.tournaments.types": ("Entrant", "Match", "MatchResult", "Player", "SnapshotEvent",
                                  "TournamentError"),
})
