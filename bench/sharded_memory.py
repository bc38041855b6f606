"""Sharded training's memory, on the pool's own path: each worker's training state with
``resources.sharding: fsdp`` against replicas (``sharding: none``), side by side in one run.

For each case (full weights with AdamW; LoRA), two Ray pools of 2 workers over the same model
folder take the same training steps on the same trajectories; then every worker reports
(``PolicyWorker.held_bytes``) the bytes it holds of trained parameters, their gradients and
AdamW state (its shards where sharded), the rollout module's separate copy of the weights
(sharded pools only: the full weights gathered once per update, as a vLLM engine holds
them), and its process's peak RSS. The figure the issue asks for is the worst worker's
parameters + optimizer state over the unsharded worker's (goal <= 0.6x); gradients and the
rollout copy are printed beside it. Both pools' final weights are compared (same step).

Run:  .venv/bin/python bench/sharded_memory.py                 (about 3 minutes on 2 cores)
      .venv/bin/python bench/sharded_memory.py --preset llama-tiny --steps 1   (quick look)
Writes bench/results/sharded_memory.json (every worker's figures, commit, machine, load).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from agentrt.algos.config import AlgorithmConfig
from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import ModelConfig, PolicyConfig, RuntimeConfig
from agentrt.core.types import Trajectory, Turn
from agentrt.policies.models import build_model
from agentrt.runtime.ray_pool import PolicyPool

RESULTS = Path(__file__).parent / "results" / "sharded_memory.json"


def policy(folder: Path, lora: bool, sharding: str) -> PolicyConfig:
    return PolicyConfig(model=ModelConfig(path=str(folder)), lora={"enabled": lora, "r": 8},
                        algorithm=AlgorithmConfig(name="grpo"), optim={"lr": 1e-4},
                        rollout={"sampling": SamplingConfig(max_new_tokens=16)},
                        resources={"num_workers": 2, "cpus_per_worker": 0.5,
                                   "sharding": sharding})


def trajectories(pool: PolicyPool, step: int) -> list[Trajectory]:
    """16 completions of 4 prompts (groups of 4), rewards by parity of the response length."""
    tok = pool.tokenizer
    prompts = [[tok.bos_token_id] + tok.encode(f"{step}: count {a} to {a + 3}")
               for a in range(4) for _ in range(4)]
    comps = pool.generate(prompts)
    return [Trajectory([Turn(p, c.response_ids, c.logprobs,
                             reward=float(len(c.response_ids) % 2))], group_id=f"{step}|{i // 4}")
            for i, (p, c) in enumerate(zip(prompts, comps))]


def run_case(folder: Path, lora: bool, steps: int) -> dict[str, Any]:
    pools = {s: PolicyPool(policy(folder, lora, s), seed=0) for s in ("none", "fsdp")}
    try:
        for step in range(steps):
            trajs = trajectories(pools["none"], step)  # one sample for both pools
            for pool in pools.values():
                pool.train(trajs)
        held = {s: pool._call(lambda w: w.held_bytes) for s, pool in pools.items()}
        a, b = pools["none"].weights(), pools["fsdp"].weights()
        diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    finally:
        for pool in pools.values():
            pool.shutdown()
    whole = max(w["params"] + w["optimizer"] for w in held["none"])
    worst = max(w["params"] + w["optimizer"] for w in held["fsdp"])
    with_grads = (max(w["params"] + w["optimizer"] + w["grads"] for w in held["fsdp"])
                  / max(w["params"] + w["optimizer"] + w["grads"] for w in held["none"]))
    return {"workers": held, "ratio_params_optimizer": worst / whole,
            "ratio_with_grads": with_grads, "max_weight_diff": diff}


def machine() -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    return {"commit": commit, "platform": platform.platform(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "loadavg": os.getloadavg()}


def mib(n: int) -> str:
    return f"{n / 2**20:7.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-base")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    from agentrt.runtime.ray_pool import ensure_ray

    ensure_ray(RuntimeConfig(num_cpus=2))
    folder = build_model(Path(tempfile.mkdtemp(prefix="agentrt-shard-")) / args.preset,
                         args.preset, seed=0)
    started = machine()
    print(f"# bench/sharded_memory.py --preset {args.preset} --steps {args.steps}: commit "
          f"{started['commit'][:10]}, load average {started['loadavg'][0]:.2f}", flush=True)
    cases = {}
    for lora in (False, True):
        name = "lora" if lora else "full"
        case = cases[name] = run_case(folder, lora, args.steps)
        print(f"\n{name}: 2 workers, after {args.steps} GRPO steps (MiB; per worker)")
        print("  sharding  worker  params  grads  optimizer  rollout_copy  peak_rss")
        for sharding, workers in case["workers"].items():
            for i, w in enumerate(workers):
                print(f"  {sharding:8s}  {i:6d} {mib(w['params'])} {mib(w['grads'])} "
                      f"{mib(w['optimizer'])}    {mib(w['rollout_copy'])}    "
                      f"{mib(w['max_rss'])}")
        print(f"  params + optimizer state, worst sharded worker / unsharded worker: "
              f"{case['ratio_params_optimizer']:.3f}x (goal <= 0.6x); with gradients "
              f"{case['ratio_with_grads']:.3f}x; weights of the two pools differ by at most "
              f"{case['max_weight_diff']:.2e}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)},
                                    "machine": started | {"loadavg_end": os.getloadavg()},
                                    "cases": cases}, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
