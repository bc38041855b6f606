"""Does a learned reward model drive GRPO as far as the exact-match reward? (issue 14, must-show 4)

One run of examples/arith_grpo.yaml's setting (2-digit addition, llama-tiny, byte tokenizer):

1. the SFT warm start alone (``train.steps=0``): its final_model is both arms' starting policy;
2. examples/train_reward_model.py trains a reward model from that SFT model's backbone (more
   next-token steps on right answers, two layers on top, a pointwise head whose reward is
   P(right), a per-token "right so far" loss beside it) on the right answer vs hard negatives
   (weighted to the tens digit) and vs the SFT policy's own wrong samples, on prompts of the
   task's training split, and reports its accuracy per negative kind on held-out prompts;
3. per seed, GRPO from the SFT model twice, same seed, prompts and steps: ``reward:
   exact_match`` and ``reward: {model: RM}``; held-out exact match (greedy, the task's eval
   split, which the reward model never saw) before and after, side by side, and the ratio of
   the gains.

    .venv/bin/python bench/reward_model_grpo.py [--steps 100] [--seeds 0 1] [--set k=v ...]

The GRPO runs are fresh processes, ``--jobs`` at once; the exact-match arms run while the
reward model trains. Wall time is not the point here (the figures are accuracies).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

from agentrt.config.load import load_config
from agentrt.workloads.prompts.workload import Trainer
from agentrt.workloads.prompts.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def run(config: str, overrides: list[str], run_dir: Path) -> list[tuple[int, float]]:
    """(step, held-out exact match) of each evaluation of one run."""
    cfg = load_config(config, [*overrides, f"run_dir={run_dir}", "progress=false"], TrainConfig)
    Trainer(cfg).run()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]


def train_rm(folder: Path, policy: Path, args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(ROOT / "examples"))
    import train_reward_model

    return train_reward_model.train(
        folder, init=str(policy), policy=str(policy), lm_steps=args.rm_lm_steps,
        steps=args.rm_steps, lr=args.rm_lr, loss=args.rm_loss,
        policy_samples_per_prompt=args.rm_samples, extra_layers=args.rm_extra_layers,
        position_loss=args.rm_position_loss,
        negative_weights=train_reward_model.parse_weights(args.rm_negative_weights),
        log_every=250)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/arith_grpo.yaml")
    ap.add_argument("--steps", type=int, default=100, help="GRPO steps of each arm")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="GRPO seeds")
    ap.add_argument("--jobs", type=int, default=4, help="GRPO runs at once (fresh processes)")
    ap.add_argument("--rm-steps", type=int, default=1200, help="reward model pair steps")
    ap.add_argument("--rm-lr", type=float, default=3e-4, help="reward model pair-step lr")
    ap.add_argument("--rm-lm-steps", type=int, default=600,
                    help="reward model next-token steps before the pairs")
    ap.add_argument("--rm-loss", choices=("bt", "bce"), default="bce")
    ap.add_argument("--rm-samples", type=int, default=4,
                    help="policy samples per prompt as on-policy negatives")
    ap.add_argument("--rm-extra-layers", type=int, default=2,
                    help="decoder layers the reward model adds on top of the SFT backbone")
    ap.add_argument("--rm-position-loss", type=float, default=1.0,
                    help="weight of the reward model's per-token 'right so far' loss")
    ap.add_argument("--rm-negative-weights", nargs="*", default=["off_by_10=6", "tens_digit=6"],
                    metavar="KIND=W",
                    help="relative weights of the reward model's hard-negative kinds")
    ap.add_argument("--policy", default=None,
                    help="start from this SFT model folder (a run's final_model) instead of "
                         "running the warm start")
    ap.add_argument("--rm", default=None,
                    help="use this reward model folder (trained from --policy) instead of "
                         "training one")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-rm-grpo-"))
    if args.policy:
        policy = Path(args.policy)
    else:
        start = time.perf_counter()
        run(args.config, [*args.overrides, "train.steps=0"], work / "sft")
        policy = work / "sft" / "final_model"
        print(f"SFT: {time.perf_counter() - start:.0f} s", flush=True)

    def arm(pool: ProcessPoolExecutor, seed: int, name: str, reward: str) -> Future:
        return pool.submit(run, args.config, [
            *args.overrides, f"seed={seed}", f"train.steps={args.steps}", "sft.steps=0",
            "policy.model.preset=null", f"policy.model.path={policy}", f"reward={reward}"],
            work / f"{name.replace(' ', '_')}_{seed}")

    # the exact-match arms need no reward model: they run while it trains
    with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = {(seed, "exact match"): arm(pool, seed, "exact match", "exact_match")
                   for seed in args.seeds}
        start = time.perf_counter()
        rm_dir = Path(args.rm) if args.rm else work / "rm"
        rm = (json.loads((rm_dir / "reward_model.json").read_text()) if args.rm
              else train_rm(rm_dir, policy, args))
        print(f"reward model: {time.perf_counter() - start:.0f} s", flush=True)
        learned = json.dumps({"model": str(rm_dir), "name": "rm"})
        futures |= {(seed, "learned RM"): arm(pool, seed, "learned RM", learned)
                    for seed in args.seeds}
        curves = {key: future.result() for key, future in futures.items()}
    report(rm, args, curves)
    print(f"(run folders under {work})")


def report(rm: dict, args: argparse.Namespace,
           curves: dict[tuple[int, str], list[tuple[int, float]]]) -> None:
    if "backbone_exact_match" in rm:
        print(f"reward model's backbone (SFT + {rm['lm_steps']} next-token steps): greedy "
              f"exact match {rm['backbone_exact_match']:.3f} on its held-out prompts")
    kinds = "  ".join(f"{k} {v:.3f}" for k, v in rm["heldout_by_kind"].items())
    print(f"reward model (+{rm.get('extra_layers', 0)} layers, {rm['steps']} "
          f"{rm['loss_kind']} steps), "
          f"held-out pair accuracy ({rm['heldout_prompts']} prompts, "
          f"{rm['heldout_policy_pairs']} policy pairs): {kinds}")
    gains: dict[str, list[float]] = {"exact match": [], "learned RM": []}
    # the step-100 gain rests on one evaluation of 256 prompts; the mean over the evaluations
    # after step 0 is the same comparison with less noise
    areas: dict[str, list[float]] = {"exact match": [], "learned RM": []}
    for seed in args.seeds:
        em, lrm = curves[seed, "exact match"], curves[seed, "learned RM"]
        print(f"seed {seed}\n{'step':>5}  {'exact-match reward':>18}  {'learned RM reward':>17}")
        for (step, a), (_, b) in zip(em, lrm):
            print(f"{step:5d}  {a:18.3f}  {b:17.3f}")
        for name, curve in (("exact match", em), ("learned RM", lrm)):
            gains[name].append(curve[-1][1] - curve[0][1])
            areas[name].append(sum(acc - curve[0][1] for _, acc in curve[1:])
                               / max(1, len(curve) - 1))
    mean = {k: sum(v) / len(v) for k, v in gains.items()}
    per_seed = ", ".join(f"{100 * a:+.1f}/{100 * b:+.1f}"
                         for a, b in zip(gains["exact match"], gains["learned RM"]))
    ratio = mean["learned RM"] / mean["exact match"] if mean["exact match"] else float("nan")
    print(f"gain in held-out exact match after {args.steps} steps (points, exact match/learned "
          f"RM per seed): {per_seed}; mean exact match {100 * mean['exact match']:+.1f}, "
          f"learned RM {100 * mean['learned RM']:+.1f}; RM/exact-match ratio {ratio:.2f}")
    area = {k: sum(v) / len(v) for k, v in areas.items()}
    area_ratio = area["learned RM"] / area["exact match"] if area["exact match"] else float("nan")
    print(f"mean gain over the evaluations after step 0 (points): exact match "
          f"{100 * area['exact match']:+.1f}, learned RM {100 * area['learned RM']:+.1f}; "
          f"ratio {area_ratio:.2f}")


if __name__ == "__main__":
    main()
