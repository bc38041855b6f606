"""DPO on the built-in arithmetic preferences: held-out preference accuracy and greedy exact match
before and after, side by side, with the wall time of the whole run.

"Before" is the policy after its SFT warm start (it is also the DPO reference, so its implicit-
reward accuracy is 0.5 up to float noise); "after" is the policy after ``train.steps`` DPO steps.
``likelihood accuracy`` is how often the policy alone gives the chosen answer the higher
probability, which SFT already moves above 0.5.

Run:  python bench/dpo_arith.py [--threads 2] [--set section.field=value ...]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time

import torch

from agentrt.config.load import load_config
from agentrt.workloads.prompts.workload import Trainer
from agentrt.workloads.prompts.config import TrainConfig

ROWS = [("preference accuracy (held-out pairs)", "eval/pref_accuracy"),
        ("likelihood accuracy (held-out pairs)", "eval/pref_likelihood_accuracy"),
        ("exact match, greedy (held-out prompts)", "eval/accuracy")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/arith_dpo.yaml")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (cores used)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    run_dir = tempfile.mkdtemp(prefix="bench-dpo-")
    cfg = load_config(args.config, [f"run_dir={run_dir}", f"threads={args.threads}",
                                    "progress=false", *args.overrides], TrainConfig)
    start = time.perf_counter()
    trainer = Trainer(cfg)
    trainer.run()
    wall = time.perf_counter() - start
    log = trainer.run_dir.read_metrics()
    before, after = log[0], log[-1]
    algo = cfg.policy.algorithm
    print(f"{algo.name} (beta {algo.beta}) on {cfg.data.path}: SFT {cfg.sft.steps} steps, then "
          f"{cfg.train.steps} steps x {cfg.train.prompts_per_step} pairs; "
          f"{torch.get_num_threads()} threads")
    print(f"{'metric':<42}{'before':>8}{'after':>8}")
    for label, key in ROWS:
        print(f"{label:<42}{before[key]:>8.3f}{after[key]:>8.3f}")
    sft_s = before.get("timing_s/warm_start", 0.0)
    print(f"wall time {wall:.0f} s (SFT warm start {sft_s:.0f} s); run folder {run_dir}")


if __name__ == "__main__":
    main()
