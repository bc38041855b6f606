"""Seats and roles: every format seats one allowed player per seat in 1-, 2- and 3-seat envs and in
Bargain-v0 with each side pinned to its own policy; schedules are deterministic per seed and
resume exactly; PFSP draws each seat independently; config errors for bad roles; two-seat
configs schedule exactly what they did before seats and roles existed."""

from __future__ import annotations

import json
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tournament_sim import play

from agentrt.core.errors import ConfigError
from agentrt.tournaments.config import build_scheduler
from agentrt.tournaments.scheduling import pfsp_probs
from agentrt.tournaments.seating import resolve_seats
from agentrt.tournaments.selfplay import PFSP
from agentrt.tournaments.session import Tournament
from agentrt.tournaments.types import Entrant, Match, MatchResult, Player, TournamentError
from agentrt.tournaments import scheduling

FORMATS = ["round_robin", "swiss", "mirror", "lagged", "fsp", "pfsp", "league"]
TRI = {"Tri-v0": ["north", "east", "south"]}  # a synthetic 3-player game
MIXED = ["Tri-v0", "TicTacToe-v0", "Recall-v0"]  # 3, 2 and 1 seats


def _outcome(match) -> MatchResult:
    """Scores 0 / 0.5 / 1 per seat, seeded by the match id (a replayed match ends the same)."""
    rng = np.random.default_rng(zlib.crc32(match.match_id.encode()))
    return MatchResult(match, tuple(float(x) for x in rng.integers(0, 3, len(match.players)) / 2))


def _entrants(fmt: str, mixed: bool = False) -> list[Entrant]:
    if fmt in ("mirror", "lagged"):
        return [Entrant("lm", True)]
    if fmt == "league":
        return [Entrant("lm", True, "main"), Entrant("mx", True, "main_exploiter"),
                Entrant("lx", True, "league_exploiter"), Entrant("random"),
                Entrant("north_bot", roles=("north",))]
    if fmt in ("round_robin", "swiss"):
        return [Entrant(n) for n in ("a", "b", "c", "d")] + [
            Entrant("north_bot", roles=("north",)),
            Entrant("closer", roles=("south", "agent") if mixed else ("south",))]
    return [Entrant("lm", True), Entrant("lm2", True), Entrant("random"),
            Entrant("north_bot", roles=("north",))]


def _check_seating(sched, matches) -> None:
    """One player per seat, each allowed there; self-play: the learner it was scheduled for."""
    for m in matches:
        agents = sched.seat_names[m.env]
        assert len(m.players) == len(agents), m
        for seat, p in enumerate(m.players):
            assert sched.entrant(p.policy_id).may_play(agents[seat]), (m, seat)
        if sched.name not in ("round_robin", "swiss"):
            assert any(p.learning for p in m.players), m


def _drive(sched, steps: range, per_step: int = 7) -> list:
    log = []
    for step in steps:
        matches = sched.next_matches(per_step)
        _check_seating(sched, matches)
        sched.report([_outcome(m) for m in matches])
        events = sched.on_step(step, {e.policy_id: step for e in sched.entrants if e.learning})
        log += [m.to_dict() for m in matches] + [ev.player.key for ev in events]
    return log


def _assert_deterministic_and_resumable(make, steps: int = 10) -> list:
    full = make(5)
    full.on_step(0, {})
    expected = _drive(full, range(1, steps + 1))
    first = make(5)
    first.on_step(0, {})
    got = _drive(first, range(1, steps // 2 + 1))
    resumed = make(5)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    got += _drive(resumed, range(steps // 2 + 1, steps + 1))
    assert got == expected
    ids = [e["match_id"] for e in expected if isinstance(e, dict)]
    assert ids == [f"m{i:08d}" for i in range(len(ids))] and ids
    other = make(6)
    other.on_step(0, {})
    if make(5).name != "mirror":  # mirror draws nothing at random
        assert _drive(other, range(1, steps + 1)) != expected
    return expected


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_seats_a_3_seat_env_validly_deterministically_and_resumably(fmt) -> None:
    cfg = {"format": fmt, "rounds": 4, "snapshot": {"every": 3, "min_steps": 1}}
    log = _assert_deterministic_and_resumable(
        lambda seed: build_scheduler(cfg, _entrants(fmt), ["Tri-v0"], seed, seats=TRI))
    sizes = Counter(len(e["players"]) for e in log if isinstance(e, dict))
    assert set(sizes) == {3}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_mixes_1_2_and_3_seat_envs(fmt) -> None:
    cfg = {"format": fmt, "rounds": 6, "snapshot": {"every": 3, "min_steps": 1}}
    log = _assert_deterministic_and_resumable(
        lambda seed: build_scheduler(cfg, _entrants(fmt, True), MIXED, seed, seats=TRI), steps=12)
    envs = Counter((e["env"], len(e["players"])) for e in log if isinstance(e, dict))
    assert set(envs) == {("Tri-v0", 3), ("TicTacToe-v0", 2), ("Recall-v0", 1)}, envs
    if fmt not in ("round_robin", "swiss"):  # the learner plays one-seat tasks alone
        solo = [e for e in log if isinstance(e, dict) and e["env"] == "Recall-v0"]
        assert all(e["players"][0]["learning"] for e in solo)


def test_seats_default_to_the_registered_envs_agents() -> None:
    seats = resolve_seats(["Bargain-v0", "Recall-v0", "TicTacToe-v0", "ttt"],
                          {"TicTacToe-v0": ["x", "o"]})
    assert seats == {"Bargain-v0": ("player_0", "player_1"), "Recall-v0": ("agent",),
                     "TicTacToe-v0": ("x", "o"), "ttt": ("player_0", "player_1")}
    with pytest.raises(TournamentError, match="not in the tournament's envs"):
        resolve_seats(["ttt"], {"Kuhn-v0": ["a", "b"]})
    with pytest.raises(TournamentError, match="distinct agent names"):
        resolve_seats(["ttt"], {"ttt": ["a", "a"]})


# -------------------------------------------------------------- Bargain-v0, one policy per side
BUYER, SELLER = "player_0", "player_1"  # Bargain-v0's agents: the first mover buys here
BARGAIN = [Entrant("buyer", True, roles=(BUYER,)), Entrant("seller", True, roles=(SELLER,)),
           Entrant("haggler", roles=(SELLER,))]


@pytest.mark.parametrize("fmt", ["fsp", "pfsp", "league", "round_robin", "swiss"])
def test_bargain_with_pinned_roles_keeps_each_side_in_its_seat(fmt) -> None:
    cfg = {"format": fmt, "rounds": 5, "snapshot": {"every": 2, "min_steps": 1}}
    log = _assert_deterministic_and_resumable(
        lambda seed: build_scheduler(cfg, BARGAIN, ["Bargain-v0"], seed))
    matches = [e for e in log if isinstance(e, dict)]
    firsts = Counter(e["players"][0]["policy_id"] for e in matches)
    seconds = Counter(e["players"][1]["policy_id"] for e in matches)
    assert set(firsts) == {"buyer"} and set(seconds) <= {"seller", "haggler"}
    if fmt in ("round_robin", "swiss"):
        return
    learners = Counter(p["policy_id"] for e in matches for p in e["players"] if p["learning"])
    assert learners["buyer"] > 0 and learners["seller"] > 0  # both sides train
    snaps = Counter((i, p["policy_id"]) for e in matches for i, p in enumerate(e["players"])
                    if p["snapshot"])
    assert snaps[(0, "buyer")] > 0 and snaps[(1, "seller")] > 0  # snapshots keep their side
    assert any(k.startswith("buyer@") and k != "buyer@0" for k in log if isinstance(k, str))


def test_pinned_learner_faces_only_opponents_allowed_opposite() -> None:
    """Only the buyer learns: its opponents are the seller-side players, never its own past,
    and its win-rate snapshot rule looks only at them (its own snapshots, never met, would keep
    the lowest win rate at the 0.5 prior and block the rule)."""
    entrants = [Entrant("buyer", True, roles=(BUYER,)), Entrant("seller"),
                Entrant("haggler", roles=(SELLER,))]
    rule = {"every": None, "win_rate": 0.7, "min_steps": 2}
    sched = build_scheduler({"format": "pfsp", "snapshot": rule}, entrants, ["Bargain-v0"], 1)
    sched.on_step(0, {})
    fired = []
    for step in range(1, 6):
        ms = sched.next_matches(20)
        assert all(m.keys[0] == "buyer" and m.keys[1] in ("seller", "haggler") for m in ms)
        sched.report([MatchResult(m, (1.0, 0.0)) for m in ms])
        fired += [(step, ev.player.key) for ev in sched.on_step(step, {"buyer": step})]
    assert fired[:2] == [(2, "buyer@2"), (4, "buyer@4")]


# -------------------------------------------------------------- PFSP over N seats
def test_pfsp_draws_each_other_seat_independently_by_its_weights() -> None:
    entrants = [Entrant("lm", True, roles=("north",)), Entrant("x", roles=("east",)),
                Entrant("y", roles=("east", "south")), Entrant("z", roles=("south",))]
    sched = PFSP(entrants, ["Tri-v0"], seed=7, weighting="hard", win_rate_decay=1.0, seats=TRI)
    rates = {"x": 0.2, "y": 0.5, "z": 0.9, "lm@0": 0.5}
    for opp, rate in rates.items():
        for g in range(10):
            sched.win_rates.update("lm", opp, 1.0 if g < rate * 10 else 0.0)
    n = 6000
    matches = sched.next_matches(n)
    assert all(m.keys[0] == "lm" for m in matches)  # pinned to north, seat 0
    for seat, pool in ((1, ["x", "y"]), (2, ["y", "z"])):
        expected = pfsp_probs([rates[k] for k in pool], "hard")
        seen = Counter(m.keys[seat] for m in matches)
        assert np.allclose([seen[k] / n for k in pool], expected, atol=0.02), (seat, seen)
    pair = Counter((m.keys[1], m.keys[2]) for m in matches)
    p_east = dict(zip(["x", "y"], pfsp_probs([0.2, 0.5], "hard")))
    p_south = dict(zip(["y", "z"], pfsp_probs([0.5, 0.9], "hard")))
    for (e, s), count in pair.items():  # independent draws: the joint is the product
        assert count / n == pytest.approx(p_east[e] * p_south[s], abs=0.02)


def test_win_rates_are_pairwise_from_the_learners_seat() -> None:
    sched = build_scheduler({"format": "pfsp"}, [Entrant("lm", True), Entrant("a"),
                                                 Entrant("b")], ["Tri-v0"], 0, seats=TRI)
    match = Match("m0", "Tri-v0", (Player("a"), Player("lm", learning=True), Player("b")))
    sched.report([MatchResult(match, (0.5, 1.0, 0.5))])
    assert sched.win_rates.rate("lm", "a") == sched.win_rates.rate("lm", "b") == 1.0
    assert sched.win_rates.rate("a", "lm") == 0.0 and sched.win_rates.rate("a", "b") == 0.5
    assert sched.win_rates.games("lm", "a") == 1.0


def test_one_seat_env_learner_plays_alone_and_is_not_rated(tmp_path: Path) -> None:
    with Tournament(tmp_path, {"format": "pfsp"}, [Entrant("lm", True), Entrant("random")],
                    ["Recall-v0"], seed=0) as t:
        t.on_step(0, {"lm": 0})
        ms = t.next_matches(5)
        assert all(m.keys == ("lm",) and m.players[0].learning for m in ms)
        t.record([MatchResult(m, (0.7,)) for m in ms], 1)
        assert t.store.count() == 5 and t.games == 5
        assert t.leaderboard() == [] and t.elo.leaderboard() == []


# -------------------------------------------------------------- round robin and swiss, N seats
def test_round_robin_plays_every_triple_and_rotates_every_seat() -> None:
    sched = build_scheduler({"format": "round_robin", "rounds": 2, "games_per_pairing": 3},
                            [Entrant(n) for n in "abcde"], ["Tri-v0"], seed=3, seats=TRI)
    matches = []
    while not sched.done:
        matches += sched.next_matches(11)
    assert len(matches) == 10 * 3 * 2  # C(5, 3) triples, 3 games each, 2 rounds
    by_group = Counter(frozenset(m.keys) for m in matches)
    assert len(by_group) == 10 and set(by_group.values()) == {6}
    seat_of = Counter((frozenset(m.keys), k, i) for m in matches for i, k in enumerate(m.keys))
    assert set(seat_of.values()) == {2}  # per triple: each player twice in each seat


def test_round_robin_rotates_seeded_groups_when_combinations_are_too_many(monkeypatch) -> None:
    monkeypatch.setattr(scheduling, "MAX_ROUND_GROUPS", 5)
    entrants = [Entrant(f"p{i}") for i in range(7)]
    make = lambda seed: build_scheduler(  # noqa: E731
        {"format": "round_robin", "games_per_pairing": 1}, entrants, ["Tri-v0"], seed, seats=TRI)
    _assert_deterministic_and_resumable(make)
    sched = make(0)
    first_round = sched.next_matches(3)  # ceil(7 / 3) groups: everyone plays at least once
    assert len(first_round) == 3 and sched.round == 1
    assert {k for m in first_round for k in m.keys} == {e.policy_id for e in entrants}


def test_swiss_groups_of_three_without_repeats_and_byes_for_the_rest() -> None:
    sched = build_scheduler({"format": "swiss", "rounds": 3, "games_per_pairing": 1},
                            [Entrant(f"p{i}") for i in range(7)], ["Tri-v0"], seed=2, seats=TRI)
    groups = []
    while not sched.done:
        ms = sched.next_matches(100)
        assert len(ms) == 2 and sched.next_matches(100) == []
        groups += [frozenset(m.keys) for m in ms]
        sched.report([MatchResult(m, (1.0, 0.5, 0.0)) for m in ms])
    assert len(set(groups)) == len(groups) == 6
    assert len(sched.byes) == 3 and len(set(sched.byes)) == 3
    assert sum(points for _, points in sched.standings()) == 6 * 1.5 + 3


# -------------------------------------------------------------- errors
def test_role_errors_name_the_entrant_and_the_valid_agents() -> None:
    with pytest.raises(TournamentError, match=r"'lm' has roles \['buyer'\].*player_0, player_1"):
        build_scheduler({"format": "pfsp"}, [Entrant("lm", True, roles=("buyer",))],
                        ["Bargain-v0"])
    with pytest.raises(TournamentError, match="at least one agent"):
        Entrant("lm", roles=())
    with pytest.raises(TournamentError, match=r"'mirror'.*no opponent may take \['player_1'\]"):
        build_scheduler({"format": "mirror"}, [Entrant("lm", True, roles=(BUYER,))],
                        ["Bargain-v0"])
    with pytest.raises(TournamentError, match=r"learner 'lm' can play no env.*no opponent"):
        build_scheduler({"format": "pfsp"}, [Entrant("lm", True, roles=(BUYER,)),
                                             Entrant("bot", roles=(BUYER,))], ["Bargain-v0"])
    with pytest.raises(TournamentError, match=r"nobody may take \['player_1'\]"):
        build_scheduler({"format": "round_robin"}, [Entrant("a", roles=(BUYER,)),
                                                    Entrant("b", roles=(BUYER,))], ["Bargain-v0"])
    with pytest.raises(TournamentError, match="needs at least 3 entrants"):
        build_scheduler({"format": "swiss"}, [Entrant("a"), Entrant("b")], ["Tri-v0"], seats=TRI)


def _run_config(**changes) -> dict:
    cfg = {"envs": [{"id": "Bargain-v0"}], "eval": {"opponents": []},
           "policies": [{"id": "buyer", "model": {"preset": "llama-tiny"}, "roles": [BUYER]},
                        {"id": "seller", "model": {"preset": "llama-tiny"}, "roles": [SELLER]}],
           "baselines": [{"id": "haggler", "kind": "bargain", "roles": [SELLER]}]}
    return {**cfg, **changes}


def test_run_config_roles_validate_and_reach_the_entrants() -> None:
    from agentrt.config.load import validate_config
    from agentrt.tournaments.run_config import TournamentRunConfig

    cfg = validate_config(_run_config(), TournamentRunConfig)
    assert [(e.policy_id, e.learning, e.roles) for e in cfg.entrants()] == [
        ("buyer", True, (BUYER,)), ("seller", True, (SELLER,)), ("haggler", False, (SELLER,))]
    assert cfg.env_seats() == {"Bargain-v0": (BUYER, SELLER)}
    bad = _run_config()
    bad["baselines"] = [{"id": "haggler", "kind": "bargain", "roles": ["seller"]}]
    with pytest.raises(ConfigError, match=r"baselines\.0\.roles: 'haggler' names roles "
                                          r"\['seller'\].*valid agent names: player_0, player_1"):
        validate_config(bad, TournamentRunConfig)
    nobody = _run_config(baselines=[])
    nobody["policies"][1]["roles"] = [BUYER]
    with pytest.raises(ConfigError, match="nobody may play 'player_1' of Bargain-v0"):
        validate_config(nobody, TournamentRunConfig)
    with pytest.raises(ConfigError, match=r"roles: format 'lagged'.*learner 'buyer'"):
        validate_config(_run_config(baselines=[], schedule={"format": "lagged"}),
                        TournamentRunConfig)
    with pytest.raises(ConfigError, match=r"policies\.0\.roles"):
        validate_config(_run_config(policies=[{"id": "b", "model": {"preset": "llama-tiny"},
                                               "roles": []}]), TournamentRunConfig)


# -------------------------------------------------------------- two seats as before
HEAD = Path(__file__).with_name("two_seat_at_8857db1.json")


def _head_entrants(fmt: str) -> list[Entrant]:
    fixed = [Entrant("random"), Entrant("heuristic")]
    if fmt in ("mirror", "lagged"):
        return [Entrant("lm", learning=True)]
    if fmt == "league":
        return [Entrant("lm", True, "main"), Entrant("mx", True, "main_exploiter"),
                Entrant("lx", True, "league_exploiter"), *fixed]
    if fmt in ("round_robin", "swiss"):
        return [Entrant(n) for n in ("a", "b", "c", "d", "e")]
    return [Entrant("lm", learning=True), Entrant("lm2", learning=True), *fixed]


def _head_strength(p) -> float:
    return {"random": -1.0, "heuristic": 0.5, "a": 0.3, "b": -0.2, "c": 0.1}.get(
        p.policy_id, 0.0) + 0.1 * p.version


def _line(m) -> str:
    return f"{m.match_id} {m.env} {m.round} " + ",".join(
        p.key + ("*" if p.learning else "") for p in m.players)


@pytest.mark.parametrize("envs", [["TicTacToe-v0"], ["TicTacToe-v0", "ConnectFour-v0"]])
@pytest.mark.parametrize("fmt", FORMATS)
def test_two_seat_schedules_are_those_of_the_code_before_seats(fmt, envs) -> None:
    """Recorded at commit 8857db1 (before seats and roles) with this very loop."""
    expected = json.loads(HEAD.read_text())[f"{'ttt' if len(envs) == 1 else 'ttt_c4'}/{fmt}"]
    cfg = {"format": fmt, "rounds": 6, "snapshot": {"every": 3, "min_steps": 1}}
    sched = build_scheduler(cfg, _head_entrants(fmt), envs, seed=7)
    sched.on_step(0, {})
    log = []
    for step in range(1, 11):
        ms = sched.next_matches(6)
        sched.report([play(m, _head_strength, draw_scale=0.2) for m in ms])
        events = sched.on_step(step, {e.policy_id: step for e in sched.entrants if e.learning})
        log += [_line(m) for m in ms] + [f"snapshot {e.player.key} {e.reset}" for e in events]
    assert log == expected


def test_two_seat_league_ratings_are_those_of_the_code_before_seats(tmp_path: Path) -> None:
    from agentrt.tournaments.report import build_leaderboard

    expected = json.loads(HEAD.read_text())["ttt/session_ratings"]
    with Tournament(tmp_path, {"format": "league", "snapshot": {"every": 3, "min_steps": 1}},
                    _head_entrants("league"), ["TicTacToe-v0"], seed=5) as t:
        t.on_step(0, {})
        for step in range(1, 9):
            t.record([play(m, _head_strength, draw_scale=0.2) for m in t.next_matches(12)], step)
            t.on_step(step, {"lm": step, "mx": step, "lx": step})
        got = {"openskill": [[r.key, round(r.mu, 9), round(r.sigma, 9), r.games]
                             for r in t.leaderboard()],
               "elo": [[r.key, round(r.rating, 9), r.games] for r in t.elo.leaderboard()],
               "report": [[r.key, round(r.bt_elo, 6), round(r.score, 9), r.games]
                          for r in build_leaderboard([r for r, _ in t.store.results()])]}
    assert got == expected
