"""Do chained specialists beat one generalist at the same number of training samples?

For each task family, both arms in this one run, same model preset, same seeds, same held-out
tasks:

- ``generalist``: one policy does each whole task in one answer (``planner.kind: single``);
- ``decomposer``: the rule planner splits each task, the router sends each subtask to its
  specialist (one policy per group of subtask types), the chain's output is the answer.

Each arm gets the same SFT budget in samples (split over the specialists by ``SHARES``), then RL with the same number of trajectories per step (the generalist plays as
many more tasks per step as a chain has subtasks). The samples each arm trained on are counted
from its metrics and printed. Held-out task success gets a 95% confidence interval (Wilson per
arm; the difference by the normal approximation for two proportions).

Then the LM planner (must-show 2): a planner policy with a short SFT warm start learns by RL on
the task outcome, chaining the specialists the decomposer arm trained (frozen); its held-out
plan validity and task success are printed before training, after the warm start and at the end.

    .venv/bin/python bench/decomposer.py [--families wordchain eventplan] [--sft-samples 80000]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrt.config.load import validate_config
from agentrt.decomposer.config import DecomposeConfig
from agentrt.decomposer.workload import Decomposer

GROUPS = {"wordchain": {"reader": ["parse", "format"], "calc": ["add", "sub", "mul", "div"]},
          "eventplan": {"selector": ["select"], "scheduler": ["schedule"], "writer": ["script"]}}
# How the decomposer arm splits the SFT budget over its specialists: a choice of that arm, made
# by how hard each subtask is (selecting under a budget and a window is the hardest part of an
# event plan, copying prices into a script the easiest; copying numbers out of a sentence is easy
# and the arithmetic is not); the total equals the generalist's.
SHARES = {"wordchain": {"reader": 0.2, "calc": 0.8},
          "eventplan": {"selector": 0.5, "scheduler": 0.35, "writer": 0.15}}


def policy(pid: str, skills: list[str], max_new_tokens: int = 64, **extra: Any) -> dict:
    return {"id": pid, "skills": skills, "model": {"preset": "llama-tiny"},
            "rollout": {"sampling": {"temperature": 1.0, "max_new_tokens": max_new_tokens}},
            "optim": {"lr": 5e-5, "max_grad_norm": 1.0},
            "algorithm": {"name": "grpo", "kl": {"coef": 0.0}}, "micro_batch_size": 256,
            **extra}


def config(run_dir: Path, family: str, arm: str, args: argparse.Namespace,
           tasks_per_step: int, **over: Any) -> DecomposeConfig:
    batch = 64
    sft_steps = args.sft_samples // batch
    tasks = tasks_per_step
    if arm == "generalist":
        policies = [policy("generalist", ["solve"])]
        planner = {"kind": "single"}
    else:
        policies = [policy(pid, skills, sft_steps=int(sft_steps * SHARES[family][pid]))
                    for pid, skills in GROUPS[family].items()]
        planner = {"kind": "rule"}
    data = {"seed": args.seed, "run_dir": str(run_dir), "threads": args.threads,
            "family": {"name": family, "train_size": 4000, "eval_size": args.eval_size},
            "planner": planner, "policies": policies,
            "sft": {"steps": sft_steps, "batch_size": batch, "lr": 1e-3, "warmup_steps": 20},
            "train": {"steps": args.rl_steps, "tasks_per_step": tasks, "group_size": 4},
            "eval": {"every": max(1, args.rl_steps), "examples": 4},
            "checkpoint": {"every": max(1, args.rl_steps), "keep": 1}, "progress": False}
    data.update(over)
    return validate_config(data, DecomposeConfig)


def run(cfg: DecomposeConfig) -> tuple[list[dict[str, Any]], float]:
    start = time.perf_counter()
    Decomposer(cfg).run()
    rows = [json.loads(x) for x in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    return rows, time.perf_counter() - start


def samples(cfg: DecomposeConfig, rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(SFT rows, RL trajectories) the arm trained on, from its config and metrics."""
    sft = sum((p.sft_steps if p.sft_steps is not None else cfg.sft.steps) * cfg.sft.batch_size
              for p in cfg.policies if p.trainable)
    rl = int(sum(r.get("rollout/trajectories", 0) for r in rows if r["step"] > 0))
    return sft, rl


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def compare(family: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tasks = args.tasks_per_step
    for arm in ("decomposer", "generalist"):
        cfg = config(root / f"{family}_{arm}", family, arm, args, tasks_per_step=tasks)
        rows, seconds = run(cfg)
        evals = [r for r in rows if "eval/success" in r]
        out[arm] = {"success": evals[-1]["eval/success"], "start": evals[0]["eval/success"],
                    "samples": samples(cfg, rows), "seconds": seconds, "run_dir": cfg.run_dir,
                    "subtasks": {k.removeprefix("eval/subtask_success/"): v
                                 for k, v in evals[-1].items()
                                 if k.startswith("eval/subtask_success/")}}
        if arm == "decomposer" and args.rl_steps:
            # The generalist trains on as many RL trajectories per step as the chains gave
            # (one per subtask attempt): that many whole tasks per step.
            per_step = out[arm]["samples"][1] / args.rl_steps
            tasks = max(1, round(per_step / cfg.train.group_size))
    n = args.eval_size
    g, d = out["generalist"]["success"], out["decomposer"]["success"]
    half = 1.96 * math.sqrt(g * (1 - g) / n + d * (1 - d) / n)
    print(f"\n== {family}: held-out task success on {n} tasks ==")
    print(f"{'arm':<12} {'after SFT':>9} {'final':>7} {'95% CI':>15} {'SFT rows':>9} "
          f"{'RL traj':>8} {'seconds':>8}")
    for arm in ("generalist", "decomposer"):
        r = out[arm]
        lo, hi = (max(0.0, x) for x in wilson(r["success"], n))
        print(f"{arm:<12} {r['start']:9.3f} {r['success']:7.3f} [{lo:.3f}, {hi:.3f}] "
              f"{r['samples'][0]:9d} {r['samples'][1]:8d} {r['seconds']:8.0f}")
    print(f"decomposer - generalist: {d - g:+.3f}  95% CI [{d - g - half:+.3f}, "
          f"{d - g + half:+.3f}]  (must-show: >= +0.15)")
    print("decomposer subtask success: " + ", ".join(
        f"{k} {v:.2f}" for k, v in sorted(out["decomposer"]["subtasks"].items())))
    out["diff"], out["ci"] = d - g, (d - g - half, d - g + half)
    return out


def planner_arm(family: str, specialists_dir: Path, args: argparse.Namespace, root: Path
                ) -> dict[str, Any]:
    """An LM planner with a short warm start, trained by RL over frozen trained specialists."""
    frozen = [policy(pid, skills, model={"path": str(specialists_dir / "final" / pid)},
                     trainable=False) for pid, skills in GROUPS[family].items()]
    planner = policy("planner", [], sft_steps=args.planner_sft_steps)
    # At temperature 1 a briefly warm-started planner samples almost no valid plan, so every
    # reward is 0 and GRPO has nothing to learn from; a cooler sampler explores near its plans
    # (at 0.7 about half of them parse at the start of RL).
    planner["rollout"]["sampling"]["temperature"] = args.planner_temperature
    planner["optim"] = {"lr": args.planner_lr, "max_grad_norm": 1.0}
    cfg = config(root / f"{family}_planner", family, "decomposer", args, 32,
                 planner={"kind": "lm", "policy": "planner"}, policies=[planner, *frozen],
                 train={"steps": args.planner_steps, "tasks_per_step": 32, "group_size": 4},
                 eval={"every": max(1, args.planner_steps // 4), "examples": 4})
    # Before any training: the planner as built (an untrained LM writes no valid plan).
    rows, seconds = run(cfg)
    evals = [(r["step"], r["eval/plan_valid"], r["eval/success"]) for r in rows
             if "eval/success" in r]
    print(f"\n== {family}: LM planner (warm start {args.planner_sft_steps} SFT steps, then RL on "
          "the task outcome; specialists frozen) ==")
    print("step  plan validity  task success")
    for step, valid, success in evals:
        print(f"{step:4d}  {valid:13.3f}  {success:12.3f}")
    print(f"rise from the start to the end of RL: validity {evals[-1][1] - evals[0][1]:+.3f}, "
          f"success {evals[-1][2] - evals[0][2]:+.3f}  ({seconds:.0f} s)")
    return {"evals": evals}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=["wordchain", "eventplan"])
    ap.add_argument("--sft-samples", type=int, default=80000, help="SFT rows per arm.")
    ap.add_argument("--rl-steps", type=int, default=10)
    ap.add_argument("--tasks-per-step", type=int, default=16, help="Of the decomposer arm.")
    ap.add_argument("--eval-size", type=int, default=300)
    ap.add_argument("--planner-sft-steps", type=int, default=60)
    ap.add_argument("--planner-steps", type=int, default=40)
    ap.add_argument("--planner-temperature", type=float, default=0.7)
    ap.add_argument("--planner-lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="Folder of the runs (default: a temp folder).")
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-decomposer-"))
    results = {}
    for family in args.families:
        results[family] = compare(family, args, root)
    if "wordchain" in args.families and args.planner_steps:
        results["planner"] = planner_arm("wordchain", Path(
            results["wordchain"]["decomposer"]["run_dir"]), args, root)
    print("\nsummary: " + "; ".join(
        f"{f}: decomposer - generalist {r['diff']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]"
        for f, r in results.items() if "diff" in r))
    print(f"runs: {root}")


if __name__ == "__main__":
    main()
