"""Does a learned reward model drive GRPO as far as the exact-match reward? (issue 14, must-show 4)

One run of examples/arith_grpo.yaml's setting (2-digit addition, llama-tiny, byte tokenizer):

1. the SFT warm start alone (``train.steps=0``): its final_model is both arms' starting policy;
2. examples/train_reward_model.py trains a reward model from that SFT model's backbone on
   (prompt, right answer) vs (prompt, wrong answer) pairs of the task's training split (a scalar
   head, Bradley-Terry loss) and reports its accuracy on held-out pairs;
3. GRPO from the SFT model twice, same seeds and prompts: ``reward: exact_match`` and
   ``reward: {model: RM}``; held-out exact match (greedy) before and after, side by side.

    .venv/bin/python bench/reward_model_grpo.py [--steps 100] [--rm-steps 400] [--set k=v ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from agentrt.config import load_config
from agentrt.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def run(config: str, overrides: list[str], run_dir: Path) -> list[tuple[int, float]]:
    cfg = load_config(config, [*overrides, f"run_dir={run_dir}", "progress=false"])
    Trainer(cfg).run()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/arith_grpo.yaml")
    ap.add_argument("--steps", type=int, default=100, help="GRPO steps of each arm")
    ap.add_argument("--rm-steps", type=int, default=400, help="reward model training steps")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-rm-grpo-"))
    times = {}
    start = time.perf_counter()
    sft = run(args.config, [*args.overrides, "train.steps=0"], work / "sft")
    policy = work / "sft" / "final_model"
    times["sft"] = time.perf_counter() - start
    start = time.perf_counter()
    sys.path.insert(0, str(ROOT / "examples"))
    import train_reward_model

    rm = train_reward_model.train(work / "rm", init=str(policy), lm_steps=0, steps=args.rm_steps,
                             log_every=100)
    times["reward model"] = time.perf_counter() - start
    arms = {}
    for name, reward in (("exact match", "exact_match"),
                         ("learned RM", json.dumps({"model": str(work / "rm"), "name": "rm"}))):
        start = time.perf_counter()
        arms[name] = run(args.config, [*args.overrides, f"train.steps={args.steps}",
                                       "sft.steps=0", "policy.model.preset=null",
                                       f"policy.model.path={policy}", f"reward={reward}"],
                         work / name.replace(" ", "_"))
        times[name] = time.perf_counter() - start
    print(f"SFT-only held-out exact match: {sft[-1][1]:.3f}")
    print(f"reward model: held-out pair accuracy {rm['heldout_accuracy']:.3f} "
          f"({args.rm_steps} steps)")
    print(f"{'step':>5}  {'exact-match reward':>18}  {'learned RM reward':>17}")
    for (step, a), (_, b) in zip(arms["exact match"], arms["learned RM"]):
        print(f"{step:5d}  {a:18.3f}  {b:17.3f}")
    gains = {k: v[-1][1] - v[0][1] for k, v in arms.items()}
    print(f"gain (held-out exact match, points): exact match {100 * gains['exact match']:+.1f}"
          f", learned RM {100 * gains['learned RM']:+.1f}; RM/exact-match ratio "
          f"{gains['learned RM'] / gains['exact match'] if gains['exact match'] else float('nan'):.2f}")
    print("wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))
    print(f"(run folders under {work})")


if __name__ == "__main__":
    main()
