"""N-player results: OpenSkill, Elo and Bradley-Terry rate a 3-player result (the winner rises,
two tied players stay equal), identities holding several seats count once, one-player matches
are recorded but not rated, and records and the report handle 3 seats."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrt.tournaments.ratings import (ALL, EloRatings, OpenSkillRatings, WinMatrix,
                                         fit_bradley_terry, rated_view)
from agentrt.tournaments.records import MatchStore
from agentrt.tournaments.report import build_leaderboard, write_report
from agentrt.tournaments.types import Match, MatchResult, Player
from agentrt.tournaments.report import win_rate_curves


def _result(keys: str, scores: tuple[float, ...], mid: str = "m0", env: str = "Tri-v0"
            ) -> MatchResult:
    players = tuple(Player(k.split("@")[0], int(k.split("@")[1]), snapshot=True) if "@" in k
                    else Player(k, learning=k == "lm") for k in keys.split())
    return MatchResult(Match(mid, env, players), scores)


def test_openskill_rates_three_players_by_rank_ties_equal() -> None:
    ratings = OpenSkillRatings()
    ratings.update(_result("b a c", (0.5, 1.0, 0.5)))
    (mu_a, _), (mu_b, sb), (mu_c, sc) = (ratings.rating(k) for k in "abc")
    prior = ratings.model.mu
    assert mu_a > prior > mu_b
    assert mu_b == pytest.approx(mu_c) and sb == pytest.approx(sc)
    assert [r.key for r in ratings.leaderboard("Tri-v0")][0] == "a"


def test_elo_decomposes_a_three_player_result_pairwise() -> None:
    elo = EloRatings(k=16.0)
    elo.update(_result("b a c", (0.5, 1.0, 0.5)))
    # a beats b and c: 2 x (K / (N - 1)) x (1 - 0.5) = +8; b loses to a (-4) and draws c (0)
    assert elo.rating("a") == pytest.approx(1008.0)
    assert elo.rating("b") == elo.rating("c") == pytest.approx(996.0)
    two = EloRatings(k=16.0)
    two.update(_result("a b", (1.0, 0.0), env="ttt"))
    assert two.rating("a") == pytest.approx(1008.0)  # a two-player game moves by K/2 at 50%


def test_bradley_terry_fits_the_pairwise_games_of_three_player_results() -> None:
    results = [_result("a b c", (1.0, 0.5, 0.5), mid=f"m{i}") for i in range(3)]
    matrix = WinMatrix.from_results(results)
    assert matrix.names == ["a", "b", "c"]
    assert matrix.wins[0, 1] == matrix.wins[0, 2] == 3 and matrix.draws[1, 2] == 3
    fit = fit_bradley_terry(matrix)
    assert fit.strength[0] > 0 > fit.strength[1]
    assert fit.strength[1] == pytest.approx(fit.strength[2])


def test_identity_in_several_seats_counts_once_with_its_mean_score() -> None:
    r = _result("lm lm@0 lm@0", (1.0, 0.0, 0.5))
    assert rated_view(r) == (("lm", "lm@0"), (1.0, 0.25))
    elo = EloRatings(k=16.0)
    elo.update(r)
    assert elo.rating("lm") == pytest.approx(1008.0) and elo.rating("lm@0") == 992.0
    assert WinMatrix.from_results([r]).wins.tolist() == [[0, 1], [0, 0]]


def test_single_seat_and_mirror_matches_do_not_change_ratings() -> None:
    os_, elo = OpenSkillRatings(), EloRatings()
    for r in (_result("lm", (1.0,), env="Recall-v0"), _result("lm lm", (1.0, 0.0), env="ttt")):
        os_.update(r)
        elo.update(r)
    assert os_.leaderboard(ALL) == [] and elo.leaderboard(ALL) == []
    assert WinMatrix.from_results([_result("lm", (1.0,))]).names == []


def test_records_and_report_handle_three_seats(tmp_path: Path) -> None:
    results = [_result("lm a b", (1.0, 0.5, 0.0), mid="m0"),
               _result("a lm@0 lm", (1.0, 0.0, 0.5), mid="m1"),
               _result("lm", (0.8,), mid="m2", env="Recall-v0"),
               _result("b lm", (0.0, 1.0), mid="m3", env="ttt")]
    with MatchStore(tmp_path) as store:
        assert store.add(results, step=1) == 4
        stored = store.get(["m0", "m1", "m2"])
        assert stored["m1"].match.keys == ("a", "lm@0", "lm") and stored["m2"].scores == (0.8,)
        stats = store.opponent_stats("lm")
        assert stats["a"]["games"] == 2 and stats["a"]["score"] == pytest.approx(0.5)
        assert stats["b"]["games"] == 2 and stats["b"]["win_rate"] == 1.0
        assert store.seat_stats("Tri-v0")[2] == {"games": 2, "score": pytest.approx(0.25)}
        rows = {r.key: r for r in build_leaderboard([r for r, _ in store.results()])}
        assert set(rows) == {"lm", "a", "b", "lm@0"}
        assert rows["lm"].games == 3 and rows["b"].score == pytest.approx(0.0)
        curves = win_rate_curves(store.results(), bins=1)
        assert curves["lm"]["a"] == [(1.0, 0.5)] and curves["lm"]["lm@*"] == [(1.0, 1.0)]
        page = write_report(store).read_text()
    assert "Recall-v0: seat 0 0.800 over 1" in page and "Tri-v0: seat 0" in page
