"""Ray pool overhead: one single-policy GRPO step (generate + train) in-process vs. through Ray.

    .venv/bin/python bench/ray_pool.py                     # llama-tiny, 16 prompts x 4 samples
    .venv/bin/python bench/ray_pool.py --preset llama-small --prompts 32 --rounds 5

The same workload (same prompts, same trajectories for training) runs on a :class:`LocalPool`
(one engine in this process) and on :class:`PolicyPool`s of 1 and 2 Ray workers, each with one
torch thread per worker (this process is pinned to one thread too, so 1 worker vs in-process is
like for like). Every path is warmed up first; then the paths alternate step by step for
``--rounds`` rounds and the median step time of each is reported with its ratio to in-process.
Target: Ray with 1 worker at most 1.15x the in-process step time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from agentrt.algos.config import AlgorithmConfig
from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import ModelConfig, PolicyConfig
from agentrt.runtime.pool import BasePool, LocalPool
from agentrt.runtime.ray_pool import PolicyPool
from agentrt.core.types import Trajectory, Turn


def policy(model_dir: Path, workers: int, new_tokens: int) -> PolicyConfig:
    return PolicyConfig(model=ModelConfig(path=str(model_dir)), algorithm=AlgorithmConfig(),
                        optim={"lr": 1e-4}, micro_batch_size=16,
                        rollout={"sampling": SamplingConfig(max_new_tokens=new_tokens)},
                        resources={"num_workers": workers, "cpus_per_worker": 1})


def cpu_seconds(pool: BasePool) -> float:
    """CPU time used so far by this process and, for a Ray pool, by its worker processes."""
    own = time.process_time()
    if isinstance(pool, PolicyPool):
        import ray

        own += sum(ray.get([w.__ray_call__.remote(lambda _: time.process_time())
                            for w in pool.workers]))
    return own


def step(pool: BasePool, prompts: list[list[int]], group: int) -> tuple[float, float, float]:
    """One GRPO step; returns (generate seconds, train seconds, CPU seconds of all processes)."""
    cpu = cpu_seconds(pool)
    start = time.perf_counter()
    comps = pool.generate(prompts)
    mid = time.perf_counter()
    trajs = [Trajectory([Turn(p, c.response_ids, c.logprobs,
                              reward=float(sum(c.response_ids) % 2))], group_id=str(i // group))
             for i, (p, c) in enumerate(zip(prompts, comps))]
    pool.train(trajs)
    end = time.perf_counter()
    return mid - start, end - start - (mid - start), cpu_seconds(pool) - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="llama-tiny")
    ap.add_argument("--prompts", type=int, default=16, help="distinct prompts per step")
    ap.add_argument("--group", type=int, default=4, help="samples per prompt")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5, help="timed steps per path")
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    import ray

    from agentrt.policies.models import build_model

    torch.set_num_threads(1)
    model_dir = build_model(Path(tempfile.mkdtemp()) / "m", args.preset, seed=0)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    paths: dict[str, BasePool] = {"in-process": LocalPool(policy(model_dir, 1, args.new_tokens))}
    for n in (1, 2):
        paths[f"ray {n} worker{'s' * (n > 1)}"] = PolicyPool(policy(model_dir, n, args.new_tokens))
    tok = paths["in-process"].tokenizer
    prompts = [[tok.bos_token_id] + tok.encode(f"{a}+{a * 7 % 100}=") for a in range(args.prompts)
               for _ in range(args.group)]
    times: dict[str, list[tuple[float, float, float]]] = {k: [] for k in paths}
    for name, pool in paths.items():
        for _ in range(args.warmup):
            step(pool, prompts, args.group)
    for _ in range(args.rounds):  # alternate, so that load on the machine hits every path alike
        for name, pool in paths.items():
            times[name].append(step(pool, prompts, args.group))
    for pool in paths.values():
        pool.shutdown()
    ray.shutdown()
    report(times, args)


def report(times: dict[str, list[tuple[float, float, float]]], args: argparse.Namespace) -> None:
    """Median wall time per step and its ratio to in-process; CPU seconds per step (all
    processes of the path) and their ratio, which a loaded machine disturbs far less."""
    med = {name: [statistics.median(r[i] for r in rows) for i in range(3)]
           + [statistics.median(r[0] + r[1] for r in rows)] for name, rows in times.items()}
    base_wall, base_cpu = med["in-process"][3], med["in-process"][2]
    print(f"{args.preset}, {args.prompts}x{args.group} trajectories, {args.new_tokens} new tokens, "
          f"median of {args.rounds} steps after {args.warmup} warm-up; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'path':<16}{'step_s':>8}{'gen_s':>8}{'train_s':>9}{'ratio':>8}{'cpu_s':>8}"
          f"{'cpu ratio':>11}")
    for name, (gen, train, cpu, wall) in med.items():
        print(f"{name:<16}{wall:>8.3f}{gen:>8.3f}{train:>9.3f}{wall / base_wall:>7.2f}x"
              f"{cpu:>8.3f}{cpu / base_cpu:>10.2f}x")


if __name__ == "__main__":
    main()
