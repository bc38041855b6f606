"""Async rollout vs sync on the arithmetic GRPO job: steps per second and held-out accuracy.

Per seed, the SFT warm start of examples/arith_grpo.yaml runs once (a run with train.steps=0
saves final_model); then GRPO from that model runs twice, with ``train.async_rollout`` off and
on, each in a fresh process, in alternating order per seed. Printed: steps/s of each arm (GRPO
loop wall time, evaluations included), the async/sync ratio, the final held-out exact match of
each and their difference, the generation time async hid behind the update (async/overlap_s) and
the mean staleness of the samples trained.

    .venv/bin/python bench/async_rollout.py [--seeds 0 1] [--set train.steps=100 ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARMS = ("sync", "async")


def child(args: argparse.Namespace) -> None:
    """One arm in this (fresh) process; prints one JSON line."""
    from agentrt.config.load import load_config
    from agentrt.workloads.prompts.config import TrainConfig
    from agentrt.workloads.prompts.workload import Trainer

    cfg = load_config(args.config, args.overrides, TrainConfig)
    start = time.perf_counter()
    Trainer(cfg).run()
    wall = time.perf_counter() - start
    rows = [json.loads(x) for x in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    trained = [r for r in rows if r["step"] > 0]
    t = [r["time"] for r in trained]  # steady: from step 2 on (the rollout process is up)
    print(json.dumps({
        "wall_s": wall, "steps": cfg.train.steps, "acc0": evals[0], "acc": evals[-1],
        "acc_last3": sum(evals[-3:]) / len(evals[-3:]),
        "steady": (len(t) - 2) / (t[-1] - t[1]) if len(t) > 2 else 0.0,
        "overlap_s": sum(r.get("async/overlap_s", 0.0) for r in trained),
        "staleness": sum(r.get("rollout/staleness", 0.0) for r in trained) / max(1, len(trained)),
        "threads": rows[-1].get("perf/threads")}))


def run(config: str, overrides: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--child", "--config", config]
    for o in overrides:
        cmd += ["--set", o]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/arith_grpo.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    root = Path(tempfile.mkdtemp(prefix="bench-async-"))
    results: dict[tuple[int, str], dict] = {}
    try:
        for i, seed in enumerate(args.seeds):
            common = [*args.overrides, f"seed={seed}", "progress=false"]
            sft = root / f"sft{seed}"
            run(args.config, [*common, f"run_dir={sft}", "train.steps=0"])
            start = [*common, f"policy.model.path={sft / 'final_model'}",
                     "policy.model.preset=null", "sft.steps=0"]
            for arm in ARMS if i % 2 == 0 else ARMS[::-1]:  # interleaved: order alternates
                on = "true" if arm == "async" else "false"
                results[seed, arm] = r = run(args.config, [
                    *start, f"run_dir={root / f'{arm}{seed}'}",
                    f"train.async_rollout.enabled={on}"])
                print(f"seed {seed} {arm:5s}: {r['steps'] / r['wall_s']:.3f} steps/s "
                      f"({r['wall_s']:.0f} s; {r['steady']:.3f} from step 2), held-out exact "
                      f"match {r['acc0']:.3f} -> "
                      f"{r['acc']:.3f}, overlap {r['overlap_s']:.0f} s, staleness "
                      f"{r['staleness']:.2f}, threads {r['threads']}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\nseed  steps/s sync  async  ratio  (from step 2: ratio)  final acc sync  async  "
          "diff (points)")
    for seed in args.seeds:
        s, a = results[seed, "sync"], results[seed, "async"]
        rs, ra = s["steps"] / s["wall_s"], a["steps"] / a["wall_s"]
        print(f"{seed:4d}  {rs:12.3f}  {ra:5.3f}  {ra / rs:5.2f}  {a['steady'] / s['steady']:21.2f}"
              f"  {s['acc']:14.3f}  {a['acc']:5.3f}  {100 * (a['acc'] - s['acc']):+13.1f}")
    n = len(args.seeds)
    total = {arm: sum(results[s, arm]["wall_s"] for s in args.seeds) for arm in ARMS}
    steady = {arm: sum(1 / results[s, arm]["steady"] for s in args.seeds) for arm in ARMS}
    acc = {arm: sum(results[s, arm]["acc"] for s in args.seeds) / n for arm in ARMS}
    last3 = {arm: sum(results[s, arm]["acc_last3"] for s in args.seeds) / n for arm in ARMS}
    print(f"all   steps/s ratio async/sync {total['sync'] / total['async']:.2f}x "
          f"({steady['sync'] / steady['async']:.2f}x from step 2); mean final held-out exact "
          f"match sync {acc['sync']:.3f}, async {acc['async']:.3f} "
          f"({100 * (acc['async'] - acc['sync']):+.1f} points; mean of the last 3 evaluations "
          f"{last3['sync']:.3f} vs {last3['async']:.3f}, "
          f"{100 * (last3['async'] - last3['sync']):+.1f})")


if __name__ == "__main__":
    main()
