"""Env APIs, built-in games and tasks, and the OpenSpiel/TextArena adapters."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pyspiel
import pytest
from gymnasium.utils.env_checker import check_env

from agentrt.envs.checker import check_multiagent_env
from agentrt.envs.registration import ENVS, make, make_multi
from agentrt.envs.single import calculate
from agentrt.envs.board import ttt_winner
from agentrt.envs.vector import TicTacToeVector
from agentrt.core.errors import ConfigError

SINGLE = ["Task-v0", "ToolUse-v0", "Recall-v0"]
MULTI = [("TicTacToe-v0", {}), ("TicTacToe-v0", {"compact": True}), ("ConnectFour-v0", {}), ("KuhnPoker-v0", {}), ("Bargain-v0", {}),
         ("KuhnPoker3-v0", {}), ("Bargain-v0", {"compact": True}),
         ("OpenSpiel-v0", {"game": "kuhn_poker"}), ("OpenSpiel-v0", {"game": "tic_tac_toe"}),
         ("TextArena-v0", {"env_id": "TicTacToe-v0"})]


@pytest.mark.parametrize("env_id", SINGLE)
def test_gymnasium_check_env_passes_without_warnings(env_id: str) -> None:
    env = make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any checker warning fails the test
        check_env(env)


@pytest.mark.parametrize("env_id", SINGLE)
def test_single_agent_env_is_gymnasium_registered_and_seeded(env_id: str) -> None:
    import gymnasium as gym

    env = gym.make(f"agentrt/{env_id}").unwrapped
    a, b = env.reset(seed=7)[0], env.reset(seed=7)[0]
    assert a == b and isinstance(a, str)
    obs = {env.reset(seed=s)[0] for s in range(20)}
    assert len(obs) > 1, "different seeds should give different episodes"


@pytest.mark.parametrize(("env_id", "kwargs"), MULTI)
def test_multiagent_checker_passes(env_id: str, kwargs: dict) -> None:
    check_multiagent_env(make(env_id, **kwargs))


def test_checker_catches_an_env_that_ignores_its_seed() -> None:
    from agentrt.envs.kuhn import KuhnPoker

    class Unseeded(KuhnPoker):
        def _reset(self, options):  # draws from fresh entropy: not reproducible
            options = {"deal": tuple(int(c) for c in np.random.default_rng().permutation(3)[:2])}
            super()._reset(options)

    with pytest.raises(AssertionError, match="did not reproduce"):
        check_multiagent_env(Unseeded(), seeds=tuple(range(10)))


def test_make_errors_are_one_sentence() -> None:
    with pytest.raises(ConfigError, match="unknown environment 'Nope-v0'; valid: .*TicTacToe-v0"):
        make("Nope-v0")
    assert {"TicTacToe-v0", "OpenSpiel-v0", "Recall-v0"} <= set(ENVS.names())


def test_tictactoe_rules_match_openspiel_on_random_games() -> None:
    rng = np.random.default_rng(0)
    ours = make("TicTacToe-v0")
    for game in range(200):
        theirs = make("OpenSpiel-v0", game="tic_tac_toe")
        ours.reset(seed=game)
        theirs.reset(seed=game)
        while not ours.done:
            legal = ours.legal_actions(ours.agent_selection)
            move = legal[rng.integers(len(legal))]
            assert ours.agent_selection == theirs.agent_selection
            ours.step(move)
            theirs.step(move)  # OpenSpiel action ids are the cell numbers
        assert theirs.done
        assert ours.rewards == theirs.returns()


def test_vector_tictactoe_plays_exactly_like_the_text_env() -> None:
    rng = np.random.default_rng(1)
    n = 300
    vec = TicTacToeVector()
    vec.reset(n)
    envs = [make("TicTacToe-v0") for _ in range(n)]
    for env in envs:
        env.reset(seed=0)
    active = np.arange(n)
    while active.size:
        actions = rng.integers(-1, 10, size=active.size)  # includes out-of-range moves
        rewards, done, invalid = vec.step(active, actions)
        for k, i in enumerate(active):
            env = envs[i]
            agent = env.agent_selection
            env.step(str(actions[k]))
            assert env.infos[agent]["invalid_action"] == bool(invalid[k])
            assert env.done == bool(done[k])
            assert [env.rewards["player_0"], env.rewards["player_1"]] == list(rewards[k])
            assert tuple(vec.boards[i]) == tuple(env.board)
        active = active[~done]


def test_connect_four_detects_all_four_directions() -> None:
    env = make("ConnectFour-v0")
    lines = {"vertical": ["0", "1", "0", "1", "0", "1", "0"],
             "horizontal": ["0", "0", "1", "1", "2", "2", "3"],
             "diagonal": ["0", "1", "1", "2", "2", "3", "2", "3", "3", "6", "3"]}
    for name, moves in lines.items():
        env.reset(seed=0)
        for m in moves:
            assert not env.done, name
            env.step(m)
        assert env.done and env.rewards == {"player_0": 1.0, "player_1": -1.0}, name
    env.reset(seed=0)
    for _ in range(6):
        env.step("0")
    assert "0" not in env.legal_actions(env.agent_selection)
    env.step("0")
    assert env.infos[env.agent_selection]["invalid_action"] is True


def test_kuhn_payoffs_equal_openspiel_for_every_deal_and_betting_sequence() -> None:
    game = pyspiel.load_game("kuhn_poker")
    ours = make("KuhnPoker-v0")
    for c0, c1 in itertools.permutations(range(3), 2):
        for seq in ["pp", "pbp", "pbb", "bp", "bb"]:
            ours.reset(options={"deal": (c0, c1)})
            state = game.new_initial_state()
            state.apply_action(c0)
            state.apply_action(c1)
            for move in seq:
                ours.step("pass" if move == "p" else "bet")
                state.apply_action(0 if move == "p" else 1)
            assert ours.done and state.is_terminal()
            assert [ours.rewards["player_0"], ours.rewards["player_1"]] == state.returns()


def test_three_player_kuhn_equals_openspiel_for_every_deal_and_betting_sequence() -> None:
    """KuhnPoker3-v0 is OpenSpiel's kuhn_poker with players=3: same player to move, information
    states and returns after every betting sequence of every deal (24 deals x 13 sequences)."""
    game = pyspiel.load_game("kuhn_poker", {"players": 3})
    ours = make("KuhnPoker3-v0")
    assert ours.possible_agents == ["player_0", "player_1", "player_2"]
    games = 0
    for deal in itertools.permutations(range(4), 3):
        stack: list[list[int]] = [[]]
        while stack:
            seq = stack.pop()
            state = game.new_initial_state()
            for action in [*deal, *seq]:
                state.apply_action(action)
            ours.reset(options={"deal": deal})
            for move in seq:
                ours.step("pass" if move == 0 else "bet")
            assert ours.done == state.is_terminal(), (deal, seq)
            if state.is_terminal():
                assert [ours.rewards[a] for a in ours.possible_agents] == state.returns()
                games += 1
                continue
            agent = ours.agent_selection
            assert agent == f"player_{state.current_player()}"
            assert ours.info_state(agent) == state.information_state_string()
            stack += [seq + [0], seq + [1]]
    assert games == 24 * 13


def test_bargain_compact_observation_is_the_decision_state_in_one_line() -> None:
    env = make("Bargain-v0", compact=True, max_turns=6)
    env.reset(seed=3)
    counts, values = env.counts, env.values["player_1"]
    assert env.observe("player_0").endswith(" O- T6")
    env.step("[propose 1 0 0]")  # player_0 (the opener) asks for one book
    offer = ",".join(str(c - s) for c, s in zip(counts, (1, 0, 0)))
    expected = (f"P{','.join(map(str, counts))} V{','.join(map(str, values))} O{offer} T5")
    assert env.observe("player_1") == expected
    env.step("[accept]")
    assert env.done and env.rewards["player_0"] == env.payoff("player_0", (1, 0, 0))


def test_kuhn_hides_the_other_card() -> None:
    env = make("KuhnPoker-v0")
    env.reset(options={"deal": (2, 0)})
    assert "your card is K" in env.observe("player_0")
    assert "J" not in env.observe("player_0").split("your card is")[1].split(".")[0]
    assert "your card is J" in env.observe("player_1")
    assert env.info_state("player_1") == "0"


def test_openspiel_forced_chance_outcomes_and_hidden_information() -> None:
    env = make("OpenSpiel-v0", game="kuhn_poker")
    env.reset(options={"chance_actions": [2, 0]})
    assert env.observe_struct("player_0")["info_state"] == "2"
    assert env.observe_struct("player_1")["info_state"] == "0"
    env.step("Bet")
    env.step("pass")  # case-insensitive match of OpenSpiel's "Pass"
    assert env.done and env.returns() == {"player_0": 1.0, "player_1": -1.0}
    with pytest.raises(ValueError, match="chance action 7 is not possible"):
        env.reset(options={"chance_actions": [7]})


def test_bargain_deal_pays_each_side_its_private_values() -> None:
    env = make("Bargain-v0")
    env.reset(seed=3)
    counts = env.counts
    books, hats, balls = counts
    env.step(f"Hi! I would like everything. [propose books={books} hats={hats} balls={balls}]")
    struct = env.observe_struct("player_1")
    assert struct["offer"] == (0, 0, 0)
    assert "Other: Hi! I would like everything." in env.observe("player_1")
    env.step("[accept]")
    assert env.done
    assert env.rewards == {"player_0": 1.0, "player_1": 0.0}


def test_bargain_without_deal_pays_nothing_and_rejects_impossible_moves() -> None:
    env = make("Bargain-v0", max_turns=2)
    env.reset(seed=0)
    env.step("[accept]")  # nothing to accept yet
    assert env.infos["player_0"]["invalid_action"] is True
    env.step("[propose books=99 hats=0 balls=0]")
    assert env.infos["player_0"]["invalid_action"] is True
    env.step("let us talk")
    env.step("sure")
    assert env.done and env.rewards == {"player_0": 0.0, "player_1": 0.0}


def test_calculator_is_safe_on_garbage() -> None:
    assert calculate("347*29+815*6") == 347 * 29 + 815 * 6
    for bad in ["__import__('os')", "9**9**9", "1/0", "x" * 300, "", "(", "[1]*9", "2**0.5j"]:
        with pytest.raises(ValueError):
            calculate(bad)


def test_tool_use_env_returns_the_tool_output_as_next_observation() -> None:
    env = make("ToolUse-v0")
    obs, info = env.reset(seed=5)
    expr = info["expression"]
    obs, reward, term, trunc, _ = env.step(f"calc: {expr}")
    assert obs == f"calc result: {calculate(expr)}" and reward == 0.0 and not term
    obs, reward, term, trunc, info = env.step(f"answer: {calculate(expr)}")
    assert reward == 1.0 and term and info["correct"]


def test_task_env_scores_with_the_reward_registry() -> None:
    env = make("Task-v0", task="arithmetic", train_size=50, eval_size=10)
    obs, info = env.reset(options={"index": 3})
    answer = env.examples[3].answer
    assert obs == env.examples[3].prompt and "answer" not in info
    assert env.step(answer)[1] == 1.0
    env.reset(options={"index": 3})
    assert env.step(b"\xff\xfe")[1] == 0.0


def test_recall_world_is_fixed_across_episodes_and_revealed_at_the_end() -> None:
    env = make("Recall-v0", world_seed=4)
    keys = set()
    for seed in range(40):
        _, info = env.reset(seed=seed)
        keys.add(info["key"])
        obs, reward, term, _, info = env.step("0000")
        assert term and info["revealed"]["key"] == env.key
        assert info["revealed"]["value"] == make("Recall-v0", world_seed=4).world[env.key]
        assert info["revealed"]["value"] in obs
    assert len(keys) > 5


def test_compact_tictactoe_observation_is_the_same_state_in_one_line() -> None:
    full, compact = make_multi("TicTacToe-v0"), make_multi("TicTacToe-v0", compact=True)
    for env in (full, compact):
        env.reset(seed=0)
        for move in ("4", "0", "8"):
            env.step(move)
    assert compact.observe("player_1") == "O|O123X567X"
    assert "O 1 2\n3 X 5\n6 7 X" in full.observe("player_1")
    assert compact.observe_struct("player_1") == full.observe_struct("player_1")


def test_ttt_winner_helper() -> None:
    assert ttt_winner((1, 1, 1, 0, 0, 0, 0, 0, 0)) == 1
    assert ttt_winner((2, 0, 0, 0, 2, 0, 0, 0, 2)) == 2
    assert ttt_winner((1, 2, 1, 1, 2, 2, 2, 1, 1)) == 0
