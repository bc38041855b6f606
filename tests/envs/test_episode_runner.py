"""Episode runner with scripted and callable policies: known game statistics, seats, invalid
actions, turn limits, OpenSpiel equivalence and the memory env."""

from __future__ import annotations

import itertools
import math

import pytest

from agentrt.envs.registration import make

from agentrt.core.errors import ConfigError
from agentrt.policies.scripted import (BargainHeuristic, CalculatorAgent, ConnectFourHeuristic,
                                       KuhnPolicy, MinimaxTicTacToe, RandomPolicy, kuhn_nash)
from agentrt.policies.scripted import kuhn_info_state
from agentrt.runner.core import EpisodeRunner, EpisodeSpec, RunnerConfig, specs


def test_100k_random_tictactoe_games_match_the_known_rates() -> None:
    runner = EpisodeRunner({"a": RandomPolicy(seed=1), "b": RandomPolicy(seed=2)},
                           RunnerConfig(concurrency=4096))
    result = runner.run(specs("TicTacToe-v0", ("a", "b"), 100_000))
    m = result.metrics
    assert m["match/episodes"] == 100_000
    # Known values for uniformly random play: first player 58.5%, draw 12.7%.
    assert abs(m["match/seat_win_rate/0"] - 0.585) < 0.01
    assert abs(m["match/draw_rate"] - 0.127) < 0.01
    assert m["match/invalid_rate"] == 0.0
    # Random seats: each policy sat first about half the time.
    first = sum(r.seats["player_0"] == "a" for r in result.episodes)
    assert abs(first / 100_000 - 0.5) < 0.01


def test_per_episode_loop_agrees_with_the_vectorized_fast_path() -> None:
    rates = {}
    for vectorize in (True, False):
        runner = EpisodeRunner({"a": RandomPolicy(seed=3), "b": RandomPolicy(seed=4)},
                               RunnerConfig(concurrency=512, vectorize=vectorize))
        m = runner.run(specs("TicTacToe-v0", ("a", "b"), 4000)).metrics
        rates[vectorize] = (m["match/seat_win_rate/0"], m["match/draw_rate"])
        assert abs(m["match/seat_win_rate/0"] - 0.585) < 0.035
        assert abs(m["match/draw_rate"] - 0.127) < 0.025
    assert abs(rates[True][0] - rates[False][0]) < 0.045


def test_minimax_never_loses_to_random_or_itself() -> None:
    runner = EpisodeRunner({"minimax": MinimaxTicTacToe(seed=0), "random": RandomPolicy(seed=0),
                            "minimax2": MinimaxTicTacToe(seed=1)}, RunnerConfig(concurrency=256))
    vs_random = runner.run(specs("TicTacToe-v0", ("minimax", "random"), 600))
    results = [r.results[a] for r in vs_random.episodes for a, p in r.seats.items()
               if p == "minimax"]
    assert "loss" not in results and results.count("win") > 400
    seats = {a for r in vs_random.episodes for a, p in r.seats.items() if p == "minimax"}
    assert seats == {"player_0", "player_1"}
    selfplay = runner.run(specs("TicTacToe-v0", ("minimax", "minimax2"), 200))
    assert selfplay.metrics["match/draw_rate"] == 1.0


def _exact_value(env_id: str, kwargs: dict, deal_options, tables: dict) -> float:
    """Expected return of player_0 by walking the game tree through the env itself."""

    def walk(deal, prefix: list[str], prob: float) -> float:
        env = make(env_id, **kwargs)
        env.reset(options=deal_options(deal))
        for action in prefix:
            env.step(action)
        if env.done:
            return prob * env.rewards["player_0"]
        agent = env.agent_selection
        p_bet = tables[agent][kuhn_info_state(env.observe_struct(agent))]
        return (walk(deal, prefix + ["bet"], prob * p_bet)
                + walk(deal, prefix + ["pass"], prob * (1 - p_bet)))

    return sum(walk(d, [], 1 / 6) for d in itertools.permutations(range(3), 2))


def test_kuhn_exact_expected_returns_are_equal_in_both_envs() -> None:
    tables = {"player_0": kuhn_nash(0.2), "player_1": {**kuhn_nash(0.0), "0p": 0.9}}
    ours = _exact_value("KuhnPoker-v0", {}, lambda d: {"deal": d}, tables)
    theirs = _exact_value("OpenSpiel-v0", {"game": "kuhn_poker"},
                          lambda d: {"chance_actions": list(d)}, tables)
    assert ours == pytest.approx(theirs, abs=1e-12)
    nash = {"player_0": kuhn_nash(0.2), "player_1": kuhn_nash(0.0)}
    assert _exact_value("KuhnPoker-v0", {}, lambda d: {"deal": d}, nash) == pytest.approx(-1 / 18)


def _kuhn_mean(env: str, kwargs: dict, n: int) -> tuple[float, float]:
    runner = EpisodeRunner({"p0": KuhnPolicy(kuhn_nash(0.2), seed=1),
                            "p1": KuhnPolicy(kuhn_nash(0.0), seed=2)},
                           RunnerConfig(concurrency=1024, random_seats=False))
    eps = runner.run(specs(env, ("p0", "p1"), n, env_kwargs=kwargs)).episodes
    values = [r.returns["player_0"] for r in eps]
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def test_kuhn_builtin_and_openspiel_give_the_same_returns_through_the_runner() -> None:
    ours, se1 = _kuhn_mean("KuhnPoker-v0", {}, 6000)
    theirs, se2 = _kuhn_mean("OpenSpiel-v0", {"game": "kuhn_poker"}, 6000)
    # The equilibrium value of Kuhn poker for player_0 is -1/18 for every alpha.
    assert abs(ours - theirs) < 4 * math.hypot(se1, se2)
    assert abs(ours + 1 / 18) < 4 * se1 and abs(theirs + 1 / 18) < 4 * se2


def test_kuhn_deterministic_strategies_are_exactly_equal_deal_by_deal() -> None:
    always_bet = {k: 1.0 for k in kuhn_nash(0.0)}
    runner = EpisodeRunner({"bet": KuhnPolicy(always_bet), "nash": KuhnPolicy(kuhn_nash(0.0))},
                           RunnerConfig(random_seats=False))
    deals = [(a, b) for a in range(3) for b in range(3) if a != b]
    ours = runner.run([EpisodeSpec("KuhnPoker-v0", ("bet", "nash"), options={"deal": d})
                       for d in deals]).episodes
    theirs = runner.run([EpisodeSpec("OpenSpiel-v0", ("bet", "nash"),
                                     env_kwargs={"game": "kuhn_poker"},
                                     options={"chance_actions": list(d)}) for d in deals]).episodes
    assert [r.returns for r in ours] == [r.returns for r in theirs]


class _Garbage:
    """Plays one garbage action per turn, cycling through the nastiest inputs."""

    trainable = False
    items = ["", "x" * 100_000, b"\xff\xfe\xfa", "99", "-3", None, 3.7, "\udcff", "[[", object()]

    def __init__(self) -> None:
        self.i = 0

    def act(self, requests):
        out = []
        for _ in requests:
            out.append(self.items[self.i % len(self.items)])
            self.i += 1
        return out


@pytest.mark.parametrize("env_id,kwargs", [("TicTacToe-v0", {}), ("ConnectFour-v0", {}),
                                           ("KuhnPoker-v0", {}), ("Bargain-v0", {}),
                                           ("OpenSpiel-v0", {"game": "tic_tac_toe"}),
                                           ("TextArena-v0", {"env_id": "TicTacToe-v0"})])
def test_garbage_actions_never_crash_and_are_counted(env_id: str, kwargs: dict) -> None:
    runner = EpisodeRunner({"junk": _Garbage(), "random": RandomPolicy(seed=0)},
                           RunnerConfig(invalid_action="end", invalid_penalty=-2.0,
                                        vectorize=False))
    result = runner.run(specs(env_id, ("junk", "random"), 30, env_kwargs=kwargs))
    m = result.metrics
    assert m["match/invalid_actions"] > 0 and m["match/invalid_rate"] > 0
    for r in result.episodes:
        junk = next(a for a, p in r.seats.items() if p == "junk")
        if r.invalid[junk]:
            assert r.ended_by == "invalid" and r.results[junk] == "loss"
            assert r.returns[junk] <= -2.0


def test_retry_mode_asks_again_then_forfeits() -> None:
    calls = []

    def stubborn(request):
        calls.append(request.attempt)
        return "not a move"

    runner = EpisodeRunner({"bad": stubborn, "random": RandomPolicy()},
                           RunnerConfig(invalid_action="retry", max_retries=2, random_seats=False,
                                        invalid_penalty=-0.5))
    (rec,) = runner.run([EpisodeSpec("TicTacToe-v0", ("bad", "random"), seed=0)]).episodes
    assert calls == [0, 1, 2]
    assert rec.invalid["player_0"] == 3 and rec.ended_by == "invalid"
    assert rec.returns["player_0"] == pytest.approx(-1.5)
    assert rec.results == {"player_0": "loss", "player_1": "win"}


def test_a_raising_callable_counts_as_invalid() -> None:
    def broken(request):
        raise RuntimeError("bug in user code")

    runner = EpisodeRunner({"bad": broken, "random": RandomPolicy()})
    result = runner.run(specs("KuhnPoker-v0", ("bad", "random"), 10))
    assert result.metrics["match/forfeit_rate"] == 1.0


def test_turn_limit_ends_as_truncated_draw() -> None:
    runner = EpisodeRunner({"a": ConnectFourHeuristic(seed=0), "b": ConnectFourHeuristic(seed=1)},
                           RunnerConfig(max_turns=5))
    result = runner.run(specs("ConnectFour-v0", ("a", "b"), 20))
    assert all(r.ended_by == "turn_limit" and r.num_actions == 5 for r in result.episodes)
    assert result.metrics["match/draw_rate"] == 1.0
    assert result.metrics["match/truncated_rate"] == 1.0


def test_connect_four_heuristic_beats_random() -> None:
    runner = EpisodeRunner({"h": ConnectFourHeuristic(seed=0), "r": RandomPolicy(seed=0)})
    m = runner.run(specs("ConnectFour-v0", ("h", "r"), 100)).metrics
    assert m["match/win_rate/h"] > 0.9


def test_bargaining_heuristics_reach_verifiable_deals() -> None:
    runner = EpisodeRunner({"x": BargainHeuristic(seed=0), "y": BargainHeuristic(seed=1)})
    result = runner.run(specs("Bargain-v0", ("x", "y"), 100))
    deals = [r for r in result.episodes if any(v > 0 for v in r.returns.values())]
    assert len(deals) > 80
    assert all(0.0 <= v <= 1.0 for r in result.episodes for v in r.returns.values())


def test_tool_use_agent_solves_every_episode_with_the_calculator() -> None:
    runner = EpisodeRunner({"calc": CalculatorAgent(), "guess": RandomPolicy()})
    solved = runner.run(specs("ToolUse-v0", ("calc",), 50)).episodes
    assert all(r.returns["agent"] == 1.0 and r.num_actions == 2 for r in solved)
    guessed = runner.run(specs("ToolUse-v0", ("guess",), 50)).metrics
    assert guessed["reward/solved_rate/guess"] < 0.1


def test_recall_oracle_with_memory_separates_from_one_without() -> None:
    memory: dict[str, str] = {}

    def remembers(request):
        key = request.state["key"]
        return memory.get(key, "0000")

    def learn(record):
        fact = record.final_infos["agent"]["revealed"]
        memory[fact["key"]] = fact["value"]

    runner = EpisodeRunner({"mem": remembers, "nomem": lambda r: "0000"},
                           RunnerConfig(concurrency=1))
    with_mem = runner.run(specs("Recall-v0", ("mem",), 200, seed=100), on_episode_end=learn)
    without = runner.run(specs("Recall-v0", ("nomem",), 200, seed=100))
    a = with_mem.metrics["reward/solved_rate/mem"]
    b = without.metrics["reward/solved_rate/nomem"]
    assert a - b > 0.5, (a, b)


def test_spec_errors_are_one_sentence() -> None:
    runner = EpisodeRunner({"a": RandomPolicy()})
    with pytest.raises(ConfigError, match="unknown policy 'zzz'"):
        runner.run(specs("TicTacToe-v0", ("a", "zzz"), 1))
    with pytest.raises(ConfigError, match="names 1 players but the env has 2 seats"):
        runner.run(specs("TicTacToe-v0", ("a",), 1))
    with pytest.raises(Exception, match="extra"):
        RunnerConfig(concurency=3)


def test_seeds_reproduce_episodes() -> None:
    def run() -> list:
        runner = EpisodeRunner({"a": KuhnPolicy(kuhn_nash(0.1), seed=5), "b": RandomPolicy(2)},
                               RunnerConfig(seed=9))
        return [(r.seats, r.returns) for r in runner.run(specs("KuhnPoker-v0", ("a", "b"),
                                                               200)).episodes]

    assert run() == run()


def test_a_shared_env_pool_reuses_envs_across_runners_with_the_same_episodes() -> None:
    pool: dict = {}

    def run(env_pool: dict | None) -> list:
        runner = EpisodeRunner({"a": MinimaxTicTacToe(seed=3), "b": RandomPolicy(4)},
                               RunnerConfig(seed=9, concurrency=16), env_pool=env_pool)
        return [(r.seats, r.returns, r.num_actions)
                for r in runner.run(specs("TicTacToe-v0", ("a", "b"), 64)).episodes]

    first = run(pool)
    kept = {id(e) for envs in pool.values() for e in envs}
    assert len(kept) == 16  # one env per concurrent episode, returned when it ended
    assert run(pool) == first == run(None)  # reset envs play what fresh ones do
    assert {id(e) for envs in pool.values() for e in envs} == kept


def test_the_custom_env_example_runs_and_perfect_play_wins() -> None:
    import runpy
    from pathlib import Path

    from agentrt.envs.checker import check_multiagent_env
    from agentrt.envs.registration import ENVS, register

    path = Path(__file__).resolve().parents[2] / "examples" / "custom_env.py"
    module = runpy.run_path(str(path))  # defines Nim without registering it
    if "Nim-v0" not in ENVS:
        register("Nim-v0", module["Nim"], multi_agent=True)
    check_multiagent_env(module["Nim"]())
    runner = EpisodeRunner({"perfect": module["perfect"], "random": RandomPolicy(seed=0)})
    m = runner.run(specs("Nim-v0", ("perfect", "random"), 300)).metrics
    assert m["match/win_rate/perfect"] > 0.9


def test_env_kwargs_key_the_pool_per_run_even_when_a_dict_changes() -> None:
    """The runner writes a run's shared kwargs' JSON once: specs of two kwargs objects get envs
    of their own kwargs, and a kwargs dict changed between runs is read again."""
    pool: dict = {}
    runner = EpisodeRunner({"a": RandomPolicy(seed=5), "b": RandomPolicy(seed=6)},
                           RunnerConfig(vectorize=False), env_pool=pool)
    compact, prose = {"compact": True}, {"compact": False}
    runner.run(specs("TicTacToe-v0", ("a", "b"), 3, env_kwargs=compact)
               + specs("TicTacToe-v0", ("a", "b"), 3, env_kwargs=prose))
    assert {k: [e.compact for e in envs] for k, envs in pool.items()} == {
        'TicTacToe-v0{"compact": true}': [True] * 3, 'TicTacToe-v0{"compact": false}': [False] * 3}
    pool.clear()
    prose["compact"] = True  # the same object, other kwargs: the next run reads them again
    runner.run(specs("TicTacToe-v0", ("a", "b"), 2, env_kwargs=prose))
    assert {k: [e.compact for e in envs] for k, envs in pool.items()} == {
        'TicTacToe-v0{"compact": true}': [True] * 2}
