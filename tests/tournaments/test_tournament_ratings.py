"""Ratings on synthetic populations with known strengths: order recovery (Kendall tau) for
OpenSkill, Elo and Bradley-Terry, and calibration of the Bradley-Terry confidence intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tournament_sim import play

from agentrt.tournaments.config import build_scheduler
from agentrt.tournaments.ratings import (ALL, EloRatings, OpenSkillRatings, WinMatrix,
                                         fit_bradley_terry, kendall_tau)
from agentrt.tournaments.types import Entrant, Match, MatchResult, Player, TournamentError

TRUE = {f"p{i}": s for i, s in enumerate(np.linspace(-2.0, 2.0, 10))}  # log-odds strengths


def _round_robin_results(rounds: int, seed: int) -> list[MatchResult]:
    sched = build_scheduler({"format": "round_robin", "rounds": rounds},
                            [Entrant(k) for k in TRUE], ["ttt", "kuhn"], seed=seed)
    results = []
    while not sched.done:
        results += [play(m, lambda p: TRUE[p.key], draw_scale=0.3, seat_bonus=0.3, salt=seed)
                    for m in sched.next_matches(100)]
    return results


def test_ratings_recover_the_true_order() -> None:
    results = _round_robin_results(rounds=20, seed=1)  # 1800 games, 40 per pair
    skill, elo = OpenSkillRatings(), EloRatings(k=16)
    for r in results:
        skill.update(r)
        elo.update(r)
    truth = [TRUE[k] for k in TRUE]
    conservative = {row.key: row.rating for row in skill.leaderboard()}
    fit = fit_bradley_terry(WinMatrix.from_results(results, names=list(TRUE)))
    taus = {
        "openskill": kendall_tau(truth, [conservative[k] for k in TRUE]),
        "elo": kendall_tau(truth, [elo.rating(k) for k in TRUE]),
        "bradley_terry": kendall_tau(truth, fit.strength),
    }
    assert all(t >= 0.9 for t in taus.values()), taus
    # per-env tables exist and the pooled one counts every game
    assert set(skill.envs()) == {"ttt", "kuhn", ALL}
    assert sum(row.games for row in skill.leaderboard()) == 2 * len(results)


def test_bradley_terry_confidence_intervals_are_calibrated() -> None:
    """Coverage of nominal-95% intervals over 40 replications x 8 players (320 intervals).

    With correct intervals the coverage is ~0.95 +- 0.012 (binomial sd); [0.91, 0.985] fails both
    for intervals too narrow (e.g. ignoring the sum-zero projection or half the variance) and too
    wide (e.g. doubling the SE gives ~0.9999).
    """
    rng = np.random.default_rng(0)
    n, games = 8, 60
    covered = total = 0
    for rep in range(40):
        theta = rng.normal(0.0, 1.0, n)
        theta -= theta.mean()
        p = 1.0 / (1.0 + np.exp(-(theta[:, None] - theta[None, :])))
        wins = np.zeros((n, n))
        iu = np.triu_indices(n, 1)
        w = rng.binomial(games, p[iu])
        wins[iu] = w
        wins[(iu[1], iu[0])] = games - w
        fit = fit_bradley_terry(WinMatrix([f"p{i}" for i in range(n)], wins, np.zeros((n, n))))
        covered += int(np.sum((fit.lower <= theta) & (theta <= fit.upper)))
        total += n
    coverage = covered / total
    assert 0.91 <= coverage <= 0.985, coverage


def test_bradley_terry_recovers_strengths_with_draws_within_cis() -> None:
    results = _round_robin_results(rounds=20, seed=2)
    fit = fit_bradley_terry(WinMatrix.from_results(results, names=list(TRUE)), anchor="p0")
    truth = np.array([TRUE[k] - TRUE["p0"] for k in TRUE])
    inside = (fit.lower <= truth) & (truth <= fit.upper)
    assert inside.sum() >= 9, (fit.strength, truth)  # 95% CIs; draws make them conservative
    assert fit.se[0] == 0.0 and fit.strength[0] == 0.0  # the anchor
    assert np.all(fit.se[1:] < 0.3)  # the CIs are tight, so "inside" is not vacuous
    assert np.all(np.abs(fit.strength - truth)[1:] < 3 * fit.se[1:])
    assert fit.elo()[-1] == pytest.approx(fit.strength[-1] * 400 / math.log(10))


def test_bradley_terry_handles_a_player_who_won_everything() -> None:
    wins = np.array([[0, 10, 10], [0, 0, 6], [0, 4, 0]], dtype=float)
    fit = fit_bradley_terry(WinMatrix(["a", "b", "c"], wins, np.zeros((3, 3))))
    # the MLE of "a" is infinite; the weak prior keeps it finite (Wald CI wide, but finite)
    assert np.all(np.isfinite(fit.strength)) and np.all(np.isfinite(fit.se))
    assert fit.strength[0] > fit.strength[1] > fit.strength[2]
    with pytest.raises(TournamentError, match="anchor"):
        fit_bradley_terry(WinMatrix(["a", "b", "c"], wins, np.zeros((3, 3))), anchor="z")


def test_draws_are_equal_ranks_and_mirror_matches_are_not_rated() -> None:
    a, b = Player("a"), Player("b")
    skill, elo = OpenSkillRatings(), EloRatings()
    draw = MatchResult(Match("m0", "ttt", (a, b)), (0.5, 0.5))
    for rating in (skill, elo):
        rating.update(draw)
    assert skill.rating("a") == pytest.approx(skill.rating("b"))
    assert skill.rating("a")[1] < 25 / 3  # a draw is information: sigma shrinks
    assert elo.rating("a") == elo.rating("b") == 1000.0
    lm = Player("lm", 3, learning=True)
    skill.update(MatchResult(Match("m1", "ttt", (lm, lm)), (1.0, 0.0)))
    assert "lm" not in {r.key for r in skill.leaderboard()}
    matrix = WinMatrix.from_results([draw, MatchResult(Match("m2", "ttt", (b, a)), (1.0, 0.0))])
    assert matrix.names == ["a", "b"]
    assert np.allclose(matrix.payoff(), [[np.nan, 0.25], [0.75, np.nan]], equal_nan=True)


def test_rating_state_round_trips_and_guards_the_model() -> None:
    results = _round_robin_results(rounds=1, seed=3)
    skill, elo = OpenSkillRatings(), EloRatings()
    for r in results[:40]:
        skill.update(r)
        elo.update(r)
    skill2, elo2 = OpenSkillRatings(), EloRatings()
    skill2.load_state_dict(skill.state_dict())
    elo2.load_state_dict(elo.state_dict())
    for r in results[40:]:
        for x in (skill, elo, skill2, elo2):
            x.update(r)
    assert skill.leaderboard("kuhn") == skill2.leaderboard("kuhn")
    assert elo.leaderboard() == elo2.leaderboard()
    with pytest.raises(TournamentError, match="model"):
        OpenSkillRatings("thurstone_mosteller_full").load_state_dict(skill.state_dict())
    with pytest.raises(TournamentError, match="valid: plackett_luce"):
        OpenSkillRatings("glicko")


def test_kendall_tau_known_values() -> None:
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
