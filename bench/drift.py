"""Drift detection (agentrt.drift): false-alarm rate of runs without change, and the detection
delay of runs whose reward is changed mid-run to pay for response length.

    .venv/bin/python bench/drift.py                      # 4 seeds, 200 steps, lr 2e-4
    .venv/bin/python bench/drift.py --seeds 0 1 2 3 4 5 --steps 300 --lr 1e-4
    .venv/bin/python bench/drift.py --seeds 0 1 2 3 4 5 6 7 --keep /tmp/drift-runs

Every run is the setting of tests/test_drift.py (llama-nano, 1-digit additions after 100 SFT
steps, GRPO, 8 prompts x 2 samples a step (``--prompts-per-step``), ``reference_steps`` 20,
``window_steps`` 6, the default tests and thresholds, action ``log`` so that each signal's first
alert shows), side by side in one invocation:

- no change: ``--steps`` steps on exact match; every alert is a false alarm. Printed per signal:
  runs with an alert, alerts, and flagged steps per checked step.
- changed: 30 steps on exact match, then the run is resumed with ``--resume force`` and a reward
  that pays one point per response character (``bench.drift:pays_for_length``) for
  ``--after`` more steps. Printed per signal: the steps from the change to its first alert after
  it (an alert before it is a false alarm, counted with the runs without change), and per seed
  the step at which the policy's length visibly moved: the first step after the change whose
  3-step mean of the per-step mean length is above every one of the 20 steps before the change.
  No detector can flag the length before it moves; the alert's delay is this lag plus its own.

``--keep DIR`` keeps the run folders; ``--replay DIR`` then replays their ``episodes.sqlite``
through two other length detectors in seconds, each with its threshold set to the largest value
it reaches in the runs without change (no false alarm there, fitted in-sample), and prints the
steps from the change to their first alarm: a one-sided CUSUM of the per-step mean length
standardised by the trailing reference's per-step means (k = 0.5 sd, over the recent window), and
a one-sided Mann-Whitney test of the recent window's samples against the reference's.
"""

from __future__ import annotations

import argparse
import json
import logging
import sqlite3
import sys
import tempfile
from pathlib import Path

import numpy as np

CHANGE = 30
SIGNALS = ("response_length", "token_entropy", "topic", "reward")


def pays_for_length(prompt: str, response: str, info: dict) -> float:
    return float(len(response))


def config(run_dir: Path, model: Path, seed: int, steps: int, lr: float, prompts: int = 8) -> dict:
    return {"seed": seed, "run_dir": str(run_dir), "progress": False, "threads": 1,
            "task": {"name": "arithmetic", "train_size": 64, "eval_size": 4,
                     "options": {"digits": 1, "ops": ["+"]}},
            "policy": {"model": {"path": str(model)}, "optim": {"lr": lr},
                       "rollout": {"sampling": {"max_new_tokens": 8}}},
            "sft": {"steps": 100, "batch_size": 16},
            "train": {"steps": steps, "prompts_per_step": prompts, "group_size": 2},
            "eval": {"every": 1000}, "checkpoint": {"every": 5, "keep": 2},
            "drift": {"enabled": True, "reference_steps": 20, "window_steps": 6}}


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def train(cfg: dict, start: str = "auto") -> None:
    from agentrt.config import validate_config
    from agentrt.trainer import Trainer

    Trainer(validate_config(cfg), start=start).run()


def alarms(run: Path, until: int | None = None) -> dict[str, tuple]:
    """Per signal, (alerts, alerted steps, checked steps) of a run up to step ``until``."""
    rows = [r for r in read(run / "metrics.jsonl")
            if "drift/reward/stat" in r and (until is None or r["step"] <= until)]
    alerts = [a for a in read(run / "drift.jsonl")
              if a["event"] == "alert" and (until is None or a["step"] <= until)]
    return {s: (sum(a["signal"] == s for a in alerts),
                sum(r[f"drift/{s}/alert"] for r in rows), len(rows)) for s in SIGNALS}


def no_change(folder: Path, model: Path, seed: int, steps: int, lr: float, prompts: int
              ) -> dict[str, tuple]:
    run = folder / f"same{seed}"
    train(config(run, model, seed, steps, lr, prompts))
    return alarms(run)


def length_moved(run: Path) -> int | None:
    """The first step after the change whose 3-step mean length is above all 20 before it."""
    mean = {r["step"]: r["rollout/response_length"] for r in read(run / "metrics.jsonl")
            if "rollout/response_length" in r}
    top = max(mean[s] for s in range(CHANGE - 19, CHANGE + 1))
    for s in range(CHANGE + 1, max(mean) - 1):
        if (mean[s] + mean[s + 1] + mean[s + 2]) / 3 > top:
            return s
    return None


def changed(folder: Path, model: Path, seed: int, after: int, lr: float, prompts: int) -> dict:
    run = folder / f"changed{seed}"
    train(config(run, model, seed, CHANGE, lr, prompts))
    cfg = (config(run, model, seed, CHANGE + after, lr, prompts)
           | {"reward": "bench.drift:pays_for_length"})
    train(cfg, start="force")
    first: dict[str, int | None] = {s: None for s in SIGNALS}
    for a in read(run / "drift.jsonl"):
        if a["event"] == "alert" and a["step"] > CHANGE and first[a["signal"]] is None:
            first[a["signal"]] = a["step"] - CHANGE
    moved = length_moved(run)
    return {"first": first, "before": alarms(run, CHANGE),
            "moved": None if moved is None else moved - CHANGE}


def lengths(run: Path) -> list[np.ndarray]:
    """Per step (from 1), the response lengths of its samples, from the run's episode log."""
    with sqlite3.connect(run / "episodes.sqlite") as db:
        rows = db.execute("SELECT step, response_ids FROM episodes ORDER BY step, idx").fetchall()
    steps: dict[int, list[int]] = {}
    for step, ids in rows:
        steps.setdefault(step, []).append(len(json.loads(ids)))
    return [np.array(steps[s], float) for s in sorted(steps)]


def replay_stats(steps: list[np.ndarray], ref: int = 20, win: int = 6) -> dict[str, dict]:
    """Per detector, {step: statistic} with the bench's windows (larger: more evidence)."""
    from scipy.stats import mannwhitneyu

    means = np.array([x.mean() for x in steps])
    out: dict[str, dict] = {"cusum": {}, "mann-whitney": {}}
    for t in range(ref + win, len(steps) + 1):  # t recent steps end at step t
        lo, hi = t - win - ref, t - win
        z = (means[hi:t] - means[lo:hi].mean()) / max(means[lo:hi].std(ddof=1), 1e-9)
        out["cusum"][t] = float(np.cumsum((z - 0.5)[::-1]).max())
        p = mannwhitneyu(np.concatenate(steps[hi:t]), np.concatenate(steps[lo:hi]),
                         alternative="greater").pvalue
        out["mann-whitney"][t] = float(-np.log10(p))
    return out


def replay(folder: Path) -> None:
    same = {r.name: replay_stats(lengths(r)) for r in sorted(folder.glob("same*"))}
    changes = {r.name: replay_stats(lengths(r)) for r in sorted(folder.glob("changed*"))}
    print(f"replayed {len(same)} runs without change, {len(changes)} changed; steps from the "
          f"change to the first length alarm (- none):")
    for name in ("cusum", "mann-whitney"):
        limit = max(v for st in same.values() for v in st[name].values())
        first = [next((t - CHANGE for t, v in st[name].items() if t > CHANGE and v > limit), None)
                 for st in changes.values()]
        print(f"{name:14} (above {limit:.3g}): " + " ".join("-" if f is None else str(f)
                                                           for f in first))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--steps", type=int, default=200, help="steps of a run without change")
    ap.add_argument("--after", type=int, default=40, help="steps after the reward change")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--prompts-per-step", type=int, default=8, help="(x 2 samples each)")
    ap.add_argument("--keep", type=Path, help="keep the run folders here (default: a temp dir)")
    ap.add_argument("--replay", type=Path, help="replay the kept runs of a --keep folder")
    args = ap.parse_args()
    if args.replay is not None:
        return replay(args.replay)
    logging.basicConfig(level=logging.ERROR)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.drift importable
    from agentrt.policies import build_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) if args.keep is None else args.keep
        model = build_model(folder / "llama-nano", "llama-nano", seed=0)
        same = {seed: no_change(folder, model, seed, args.steps, args.lr, args.prompts_per_step)
                for seed in args.seeds}
        changes = {seed: changed(folder, model, seed, args.after, args.lr,
                                 args.prompts_per_step) for seed in args.seeds}
    delays = {seed: changes[seed]["first"] for seed in args.seeds}

    print(f"\nno change: {len(args.seeds)} runs x {args.steps} steps (lr {args.lr:g}, "
          f"{args.prompts_per_step} prompts x 2 samples a step)")
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
    before = {s: sum(changes[seed]["before"][s][0] for seed in args.seeds) for s in SIGNALS}
    checked = sum(changes[seed]["before"]["reward"][2] for seed in args.seeds)
    print(f"and before the change in the changed runs: {sum(before.values())} alerts in "
          f"{checked} checked steps (" + ", ".join(f"{s} {n}" for s, n in before.items()) + ")")
    print(f"\nreward changed at step {CHANGE} to pay for length: steps to the first alert "
          f"(- none in {args.after})")
    print(f"{'signal':16} " + " ".join(f"{'seed ' + str(s):>7}" for s in args.seeds))
    for s in SIGNALS:
        print(f"{s:16} " + " ".join(f"{'-' if delays[seed][s] is None else delays[seed][s]:>7}"
                                    for seed in args.seeds))
    moved = [changes[seed]["moved"] for seed in args.seeds]
    print(f"{'length moved':16} " + " ".join(f"{'-' if m is None else m:>7}" for m in moved))
    within = sum(d["response_length"] is not None and d["response_length"] <= 20
                 for d in delays.values())
    print(f"response_length alert within 20 steps of the change: {within} of {len(args.seeds)}")


if __name__ == "__main__":
    main()
