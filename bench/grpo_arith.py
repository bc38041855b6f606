"""Does RL learn? Held-out exact-match accuracy of the SFT warm start vs SFT + GRPO.

Runs examples/arith_grpo.yaml (2-digit addition, llama-tiny, byte tokenizer) end to end and
prints the step-0 accuracy (SFT only), the final accuracy (after GRPO), the gain in points and
the wall time of each phase. Target (issue 2): +20 points within 10 minutes on 2 cores.

    .venv/bin/python bench/grpo_arith.py [--config examples/arith_grpo.yaml] [--set k=v ...]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

from agentrt.config import load_config
from agentrt.trainer import Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/arith_grpo.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="bench-grpo-"))
    cfg = load_config(args.config, [*args.overrides, f"run_dir={run_dir}", "progress=false"])
    start = time.perf_counter()
    Trainer(cfg).run()
    total = time.perf_counter() - start
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    sft_s = rows[0].get("timing_s/warm_start", 0.0)  # the SFT warm start, logged with step 0
    print("step  held-out exact match")
    for step, acc in evals:
        print(f"{step:4d}  {acc:.3f}")
    first, last = evals[0][1], evals[-1][1]
    print(f"SFT-only accuracy      {first:.3f}")
    print(f"after GRPO             {last:.3f}")
    print(f"gain                   {100 * (last - first):+.1f} points")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime
    print(f"wall time: SFT {sft_s:.0f} s, GRPO {total - sft_s:.0f} s, total {total:.0f} s")
    # On a shared machine wall time is inflated by other load; CPU seconds of this process are
    # what an idle machine would need (with threads=1, wall ~= CPU there).
    print(f"CPU time of this process: {cpu:.0f} s (threads={cfg.threads or 'all'})")
    shutil.copy(run_dir / "curves.png", Path("bench_grpo_arith_curves.png"))
    print(f"curves: bench_grpo_arith_curves.png (run folder {run_dir})")


if __name__ == "__main__":
    main()
