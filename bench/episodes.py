"""Episode runner throughput: games/s for scripted policies and for a tiny LM policy, batched
(all waiting games in one generate call) versus one game at a time, measured side by side.

    .venv/bin/python bench/episodes.py                 # defaults: 256 concurrent LM games
    .venv/bin/python bench/episodes.py --lm-games 512 --seq-games 32 --preset llama-tiny

Every timed section runs after a warm-up of the same kind. The LM plays tic-tac-toe against a
random policy with invalid actions asked again (``retry``), so games have several LM turns.
Target: batched >= 10x the games/s of sequential with 256 concurrent games.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from agentrt.config.rollout import RolloutConfig, SamplingConfig
from agentrt.config.sections import ModelConfig, PolicyConfig
from agentrt.runtime.learner import Learner
from agentrt.policies.lm import LMPolicy, PromptTemplate
from agentrt.policies.models import build_model
from agentrt.policies.scripted import (ConnectFourHeuristic, KuhnPolicy, MinimaxTicTacToe,
                                       RandomPolicy)
from agentrt.runner.core import EpisodeRunner, RunnerConfig, specs


def games_per_s(runner: EpisodeRunner, env: str, players: tuple[str, ...], n: int,
                warmup: int, **kwargs: object) -> tuple[float, dict[str, float]]:
    """Warm up on ``warmup`` games, then time ``n`` games; returns (games/s, metrics)."""
    if warmup:
        runner.run(specs(env, players, warmup, seed=10**6, **kwargs))
    start = time.perf_counter()
    result = runner.run(specs(env, players, n, **kwargs))
    return n / (time.perf_counter() - start), result.metrics


def scripted_rows(n: int) -> list[tuple[str, float]]:
    rows = []
    fast = EpisodeRunner({"a": RandomPolicy(1), "b": RandomPolicy(2)},
                         RunnerConfig(concurrency=4096))
    rows.append(("tic-tac-toe random v random (vectorized)",
                 games_per_s(fast, "TicTacToe-v0", ("a", "b"), 10 * n, n)[0]))
    loop = EpisodeRunner({"a": RandomPolicy(1), "b": RandomPolicy(2), "mm": MinimaxTicTacToe(0),
                          "kuhn": KuhnPolicy(), "c4": ConnectFourHeuristic(0)},
                         RunnerConfig(concurrency=1024, vectorize=False))
    for name, env, players in [("tic-tac-toe random v random (per-episode loop)", "TicTacToe-v0",
                                ("a", "b")),
                               ("tic-tac-toe minimax v random", "TicTacToe-v0", ("mm", "a")),
                               ("kuhn poker equilibrium v random", "KuhnPoker-v0", ("kuhn", "a")),
                               ("connect-four heuristic v random", "ConnectFour-v0", ("c4", "a"))]:
        rows.append((name, games_per_s(loop, env, players, n, n // 10)[0]))
    return rows


def lm_rows(args: argparse.Namespace) -> tuple[float, float, dict[str, float]]:
    folder = build_model(Path(tempfile.mkdtemp(prefix="bench-episodes-")) / "m", args.preset)
    cfg = PolicyConfig(id="lm", model=ModelConfig(path=str(folder)),
                       rollout=RolloutConfig(batch_size=args.lm_games, sampling=SamplingConfig(
                           max_new_tokens=args.max_new_tokens)))
    engine = Learner(cfg, seed=0)
    template = PromptTemplate(first="{observation}\n> ", turn="\n{observation}\n> ")
    policies = {"lm": LMPolicy(engine, templates=template), "rand": RandomPolicy(0)}

    def runner(concurrency: int) -> EpisodeRunner:
        return EpisodeRunner(policies, RunnerConfig(concurrency=concurrency, seed=0,
                                                    invalid_action="retry", max_retries=2))

    batched, metrics = games_per_s(runner(args.lm_games), "TicTacToe-v0", ("lm", "rand"),
                                   args.lm_games, args.lm_games // 4)
    sequential, _ = games_per_s(runner(1), "TicTacToe-v0", ("lm", "rand"), args.seq_games, 2)
    return batched, sequential, metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scripted-games", type=int, default=10_000)
    parser.add_argument("--lm-games", type=int, default=256, help="Concurrent LM games.")
    parser.add_argument("--seq-games", type=int, default=32, help="LM games played one by one.")
    parser.add_argument("--preset", default="llama-tiny")
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None, help="torch threads.")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{'scripted policies':<52} {'games/s':>10}")
    for name, rate in scripted_rows(args.scripted_games):
        print(f"{name:<52} {rate:>10.0f}")
    batched, sequential, m = lm_rows(args)
    print(f"\n{args.preset} LM v random, tic-tac-toe, max_new_tokens={args.max_new_tokens}")
    print(f"{'batched (' + str(args.lm_games) + ' concurrent games)':<52} {batched:>10.2f}")
    print(f"{'sequential (1 game at a time)':<52} {sequential:>10.2f}")
    print(f"{'batched / sequential':<52} {batched / sequential:>10.1f}x  (target >= 10x)")
    print(f"mean requests per generate call (batched run): {m['rollout/batch_mean/lm']:.1f}; "
          f"invalid rate {m['match/invalid_rate']:.2f}")


if __name__ == "__main__":
    main()
