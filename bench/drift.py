"""Drift detection (agentrt.drift): false-alarm rate of runs without change, and the detection
delay of runs whose reward is changed mid-run to pay for response length.

    .venv/bin/python bench/drift.py                      # 4 seeds, 200 steps, lr 2e-4
    .venv/bin/python bench/drift.py --seeds 0 1 2 3 4 5 --steps 300 --lr 1e-4

Every run is the setting of tests/test_drift.py (llama-nano, 1-digit additions after 100 SFT
steps, GRPO, 8 prompts x 2 samples a step, ``reference_steps`` 20, ``window_steps`` 6, the
default tests and thresholds, action ``log`` so that each signal's first alert shows), side by
side in one invocation:

- no change: ``--steps`` steps on exact match; every alert is a false alarm. Printed per signal:
  runs with an alert, alerts, and flagged steps per checked step.
- changed: 30 steps on exact match, then the run is resumed with ``--resume force`` and a reward
  that pays one point per response character (``bench.drift:pays_for_length``) for
  ``--after`` more steps. Printed per signal: the steps from the change to its first alert.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

CHANGE = 30
SIGNALS = ("response_length", "token_entropy", "topic", "reward")


def pays_for_length(prompt: str, response: str, info: dict) -> float:
    return float(len(response))


def config(run_dir: Path, model: Path, seed: int, steps: int, lr: float) -> dict:
    return {"seed": seed, "run_dir": str(run_dir), "progress": False, "threads": 1,
            "task": {"name": "arithmetic", "train_size": 64, "eval_size": 4,
                     "options": {"digits": 1, "ops": ["+"]}},
            "policy": {"model": {"path": str(model)}, "optim": {"lr": lr},
                       "rollout": {"sampling": {"max_new_tokens": 8}}},
            "sft": {"steps": 100, "batch_size": 16},
            "train": {"steps": steps, "prompts_per_step": 8, "group_size": 2},
            "eval": {"every": 1000}, "checkpoint": {"every": 5, "keep": 2},
            "drift": {"enabled": True, "reference_steps": 20, "window_steps": 6}}


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def train(cfg: dict, start: str = "auto") -> None:
    from agentrt.config import validate_config
    from agentrt.trainer import Trainer

    Trainer(validate_config(cfg), start=start).run()


def no_change(folder: Path, model: Path, seed: int, steps: int, lr: float) -> dict[str, tuple]:
    run = folder / f"same{seed}"
    train(config(run, model, seed, steps, lr))
    rows = [r for r in read(run / "metrics.jsonl") if "drift/reward/stat" in r]
    alerts = read(run / "drift.jsonl")
    return {s: (sum(a["signal"] == s for a in alerts),
                sum(r[f"drift/{s}/alert"] for r in rows), len(rows)) for s in SIGNALS}


def changed(folder: Path, model: Path, seed: int, after: int, lr: float) -> dict[str, int | None]:
    run = folder / f"changed{seed}"
    train(config(run, model, seed, CHANGE, lr))
    cfg = config(run, model, seed, CHANGE + after, lr) | {"reward": "bench.drift:pays_for_length"}
    train(cfg, start="force")
    first: dict[str, int | None] = {s: None for s in SIGNALS}
    for a in read(run / "drift.jsonl"):
        if a["event"] == "alert" and first[a["signal"]] is None:
            first[a["signal"]] = a["step"] - CHANGE
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--steps", type=int, default=200, help="steps of a run without change")
    ap.add_argument("--after", type=int, default=40, help="steps after the reward change")
    ap.add_argument("--lr", type=float, default=2e-4)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.drift importable
    from agentrt.policies import build_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = build_model(folder / "llama-nano", "llama-nano", seed=0)
        same = {seed: no_change(folder, model, seed, args.steps, args.lr) for seed in args.seeds}
        delays = {seed: changed(folder, model, seed, args.after, args.lr) for seed in args.seeds}

    print(f"\nno change: {len(args.seeds)} runs x {args.steps} steps (lr {args.lr:g})")
    print(f"{'signal':16} {'runs alerted':>12} {'alerts':>7} {'flagged/checked':>16}")
    for s in SIGNALS:
        runs = sum(same[seed][s][0] > 0 for seed in args.seeds)
        alerts = sum(same[seed][s][0] for seed in args.seeds)
        flagged = sum(same[seed][s][1] for seed in args.seeds)
        checked = sum(same[seed][s][2] for seed in args.seeds)
        print(f"{s:16} {runs:>5} of {len(args.seeds):<4} {alerts:>7} "
              f"{flagged / max(checked, 1):>16.4f}")
    total = sum(same[seed][s][0] for seed in args.seeds for s in SIGNALS)
    checked = sum(same[seed]["reward"][2] for seed in args.seeds)
    print(f"false-alarm rate: {total} alerts in {checked} checked steps "
          f"({total / max(checked, 1):.4f} per step, all signals)")
    print(f"\nreward changed at step {CHANGE} to pay for length: steps to the first alert "
          f"(- none in {args.after})")
    print(f"{'signal':16} " + " ".join(f"{'seed ' + str(s):>7}" for s in args.seeds))
    for s in SIGNALS:
        print(f"{s:16} " + " ".join(f"{'-' if delays[seed][s] is None else delays[seed][s]:>7}"
                                    for seed in args.seeds))


if __name__ == "__main__":
    main()
