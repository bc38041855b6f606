"""Hexapawn and Connect-Three (agentrt.envs.games), the exact solver (agentrt.envs.solve) and the
scripted players over them: perfect, one-ply and the two games' heuristics."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentrt.core.errors import ConfigError
from agentrt.envs.checker import check_multiagent_env
from agentrt.envs.games import ConnectThree, Hexapawn
from agentrt.envs.registration import make_multi
from agentrt.envs.solve import GameSolver
from agentrt.policies.base import ActRequest
from agentrt.policies.scripted import scripted_factory

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "plugin_pkg"))
import nim_plugin  # noqa: E402,F401  (registers Nim-v0)


def request(env, env_id: str) -> ActRequest:
    agent = env.agent_selection
    return ActRequest(env, "t", env_id, agent, env.possible_agents.index(agent))


def play(env_id: str, players: list, seed: int, **kwargs) -> dict[str, float]:
    """One game, players[i] in seat i; the final rewards."""
    env = make_multi(env_id, **kwargs)
    env.reset(seed=seed)
    while not env.done:
        seat = env.possible_agents.index(env.agent_selection)
        env.step(players[seat].choose(request(env, env_id)))
    return dict(env.rewards)


@pytest.mark.parametrize("env_id", ["Hexapawn-v0", "ConnectThree-v0", "Notakto-v0"])
def test_the_new_games_keep_the_turn_based_api(env_id):
    check_multiagent_env(make_multi(env_id))


def test_hexapawn_moves_captures_and_the_three_ways_to_win():
    env = Hexapawn()
    env.reset(seed=0)
    assert env.observe("player_0") == "W|BBB345WWW"
    assert env.legal_actions("player_0") == ["63", "74", "85"]
    env.step("7-4")  # read as "74"
    assert env.observe("player_1") == "B|BBB3W5W7W"
    # Black: 0 to 3 and 2 to 5 step forward; 0 to 4 and 2 to 4 capture; 1 is blocked
    assert env.legal_actions("player_1") == ["03", "04", "24", "25"]
    env.step("04")
    assert env.board == [0, 2, 2, 0, 2, 0, 1, 0, 1]
    assert env.legal_actions("player_0") == ["63", "64", "84", "85"]
    assert not env.done

    far_row, last_pawn, no_move = Hexapawn(), Hexapawn(), Hexapawn()
    for env in (far_row, last_pawn, no_move):
        env.reset(seed=0)
    far_row.board = [0, 2, 2, 1, 0, 0, 0, 1, 1]
    far_row.step("30")
    assert far_row.done and far_row.rewards == {"player_0": 1.0, "player_1": -1.0}
    last_pawn.board = [2, 0, 0, 0, 1, 0, 0, 0, 0]
    last_pawn.agent_selection = "player_1"
    last_pawn.step("04")  # lands on the middle row, no White pawn left
    assert last_pawn.done and last_pawn.rewards == {"player_0": -1.0, "player_1": 1.0}
    no_move.board = [2, 0, 0, 0, 0, 0, 1, 0, 0]
    no_move.step("63")  # Black's only pawn is blocked and has nothing to capture
    assert no_move.done and no_move.rewards["player_0"] == 1.0


def test_hexapawn_refuses_moves_that_are_not_its_own():
    env = Hexapawn()
    env.reset(seed=0)
    for text in ("03", "64", "6", "633", "x", "36"):
        env.step(text)  # the runner, not the env, decides what an invalid move costs
        assert env.infos["player_0"]["invalid_action"] and not env.done
        assert env.board == [2, 2, 2, 0, 0, 0, 1, 1, 1]


def test_notakto_whoever_completes_a_line_loses():
    env = make_multi("Notakto-v0")
    env.reset(seed=0)
    assert env.observe("player_0") == "X|012345678" and len(env.legal_actions("player_0")) == 9
    for cell in ("0", "4", "5", "7"):  # no three in a line yet
        env.step(cell)
    assert not env.done and env.observe("player_0") == "X|X123XX6X8"
    assert env.legal_actions("player_0") == ["1", "2", "3", "6", "8"]
    env.step("4")  # taken: an invalid action, not a move
    assert env.infos["player_0"]["invalid_action"]
    env = make_multi("Notakto-v0")
    env.reset(seed=0)
    for cell in ("0", "4", "5", "7"):
        env.step(cell)
    env.step("8")  # player_0 completes the diagonal 0-4-8 and loses
    assert env.done and env.rewards == {"player_0": -1.0, "player_1": 1.0}


def test_connect_three_gravity_lines_and_the_full_grid():
    env = ConnectThree()
    env.reset(seed=0)
    assert env.observe("player_0") == "X|" + "." * 16
    for col in ("1", "2", "1", "2"):
        env.step(col)
    assert env.observe("player_0") == "X|.........XO..XO."
    env.step("1")  # X: three down column 1
    assert env.done and env.rewards == {"player_0": 1.0, "player_1": -1.0}

    env.reset(seed=0)
    for col in ("0", "1", "1", "2", "3", "2", "2"):  # X's diagonal: cells 12, 9, 6
        assert not env.done
        env.step(col)
    assert env.board[6] == env.board[9] == env.board[12] == 1 and env.done and env.rewards["player_0"] == 1.0

    # a full grid without a line is a draw
    env.reset(seed=0)
    env.board = [1, 2, 1, 0, 1, 2, 1, 2, 2, 1, 2, 1, 2, 1, 2, 1]
    env.agent_selection = "player_1"
    assert env.legal_actions("player_1") == ["3"]
    env.step("3")
    assert env.done and env.rewards == {"player_0": 0.0, "player_1": 0.0}
    env.reset(seed=0)
    env.board[0] = 1  # column 0 full
    env.step("0")
    assert env.infos["player_0"]["invalid_action"] and env.legal_actions("player_0") == \
        ["1", "2", "3"]


@pytest.mark.parametrize("env_id,value,states", [
    ("TicTacToe-v0", 0.0, 5478), ("Hexapawn-v0", -1.0, 135), ("Nim-v0", 1.0, None),
    ("Notakto-v0", 1.0, None)])
def test_the_solver_finds_each_game_value(env_id, value, states):
    """Tic-tac-toe is a draw, Hexapawn a win for Black, Nim with 15 stones a win for the
    first player (15 is not a multiple of 4), Notakto on one board a win for the first player;
    the values are discounted by game length."""
    env = make_multi(env_id)
    env.reset(seed=0)
    solver = GameSolver()
    got = solver.value(env)
    assert got == 0.0 if value == 0 else (0 < got * value <= 1.0)
    if states:
        assert len(solver.values) + 1 >= states - 1000  # every non-terminal state visited


def test_the_solver_refuses_a_tree_over_its_limit():
    env = make_multi("ConnectThree-v0")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="too large to solve"):
        GameSolver(max_states=1000).value(env)


def test_perfect_play_never_loses_and_wins_what_the_game_allows():
    # two perfect players for all games: each solves a game's tree once (a fresh player per
    # game re-solved tic-tac-toe 60 times); their tie-breaks still differ from game to game
    rand = scripted_factory("random")
    one, two = scripted_factory("perfect")(seed=0), scripted_factory("perfect")(seed=1)
    for seed in range(20):
        # Hexapawn: Black always wins; tic-tac-toe: never a loss, perfect against perfect draws
        assert play("Hexapawn-v0", [rand(seed=seed), one], seed)["player_1"] == 1
        assert play("Hexapawn-v0", [one, two], seed)["player_1"] == 1
        for seat in (0, 1):
            players = [rand(seed=seed), rand(seed=seed)]
            players[seat] = one
            assert play("TicTacToe-v0", players, seed)[f"player_{seat}"] >= 0
        assert play("TicTacToe-v0", [one, two], seed)["player_0"] == 0
        # Nim, 15 stones: the first player always wins
        assert play("Nim-v0", [one, rand(seed=seed)], seed)["player_0"] == 1
        # Notakto: the first player always wins, against random and against perfect play
        assert play("Notakto-v0", [one, rand(seed=seed)], seed)["player_0"] == 1
        assert play("Notakto-v0", [two, one], seed)["player_0"] == 1
    for seed in range(3):  # Connect-Three: the first player wins (a 2 s solve, then cached)
        assert play("ConnectThree-v0", [one, scripted_factory("connect3")(seed=seed)],
                    seed)["player_0"] == 1


def test_perfect_names_an_env_it_cannot_search():
    env = make_multi("KuhnPoker-v0")
    env.reset(seed=0)
    with pytest.raises(ConfigError, match="kind: perfect needs an env that gives state_key"):
        scripted_factory("perfect")(seed=0).choose(request(env, "KuhnPoker-v0"))


def test_the_heuristics_take_a_win_and_block_one():
    one_ply, connect = scripted_factory("one_ply")(seed=0), scripted_factory("connect3")(seed=0)
    ttt = make_multi("TicTacToe-v0")
    ttt.reset(seed=0)
    for cell in ("0", "3", "1"):  # X threatens 2; O must block
        ttt.step(cell)
    assert one_ply.choose(request(ttt, "TicTacToe-v0")) == "2"
    ttt.step("4")  # O did not block; X wins at 2
    assert one_ply.choose(request(ttt, "TicTacToe-v0")) == "2"
    c3 = make_multi("ConnectThree-v0")
    c3.reset(seed=0)
    for col in ("0", "3", "0"):  # X threatens three in column 0
        c3.step(col)
    assert connect.choose(request(c3, "ConnectThree-v0")) == "0"
    hexa = make_multi("Hexapawn-v0")
    hexa.reset(seed=0)
    hexa.board = [0, 2, 2, 1, 0, 0, 0, 1, 1]
    assert scripted_factory("hexapawn")(seed=0).choose(request(hexa, "Hexapawn-v0")) in ("30", "31")
    nim = make_multi("Nim-v0", stones=3)
    nim.reset(seed=0)
    assert one_ply.choose(request(nim, "Nim-v0")) == "3"
    notakto = make_multi("Notakto-v0")  # misère: a move that loses at once is no move
    notakto.reset(seed=0)
    for cell in ("0", "1", "3", "5", "7"):  # 2 (row 0), 4 (column 1) and 6 (column 0) lose
        notakto.step(cell)
    assert {one_ply.choose(request(notakto, "Notakto-v0")) for _ in range(20)} == {"8"}


@pytest.mark.parametrize("env_id,kind", [("Hexapawn-v0", "hexapawn"),
                                         ("ConnectThree-v0", "connect3"),
                                         ("TicTacToe-v0", "one_ply"), ("Nim-v0", "one_ply"),
                                         ("Notakto-v0", "one_ply")])
def test_each_heuristic_beats_random_and_loses_to_perfect_play(env_id, kind):
    """The baselines are what they claim: far above random, below the perfect player."""
    heuristic, rand = scripted_factory(kind)(seed=0), scripted_factory("random")(seed=1)
    games = 60 if env_id == "ConnectThree-v0" else 200
    points = 0.0
    for seed in range(games):
        seat = seed % 2
        players = [rand, rand]
        players[seat] = heuristic
        reward = play(env_id, players, seed)[f"player_{seat}"]
        points += 1.0 if reward > 0 else 0.5 if reward == 0 else 0.0
    assert points / games >= 0.75
