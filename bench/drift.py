"""Drift detection (agentrt.controller.drift): false-alarm rate of runs without change, and the detection
delay of runs whose reward is changed mid-run to pay for response length.

    .venv/bin/python bench/drift.py --seeds 0 1 2 3 4 5 6 7 --jobs 2 --keep /tmp/drift-runs
    .venv/bin/python bench/drift.py --replay /tmp/drift-runs --drift '{"patience": 4}'

Every run is the setting of tests/test_drift.py (llama-nano, 1-digit additions after 100 SFT
steps, GRPO at temperature 1 and ``--lr`` 3e-4, ``--prompts-per-step`` 8 x ``--group-size`` 4
samples a step, the drift section's defaults with ``--drift`` JSON on top, action ``log`` so
that each signal's first alert shows), one fresh process per run (``--jobs`` at a time):

- no change: ``--steps`` steps on exact match; every alert is a false alarm. Printed per signal:
  runs with an alert, alerts, and flagged steps per checked step.
- changed: 30 steps on exact match, then the run is resumed with ``--resume force`` and a reward
  that pays one point per response character (``bench.drift:pays_for_length``) for
  ``--after`` more steps. Printed per signal: the steps from the change to its first alert after
  it (an alert before it is a false alarm, counted with the runs without change), and per seed
  the step at which the policy's length visibly moved: the first step after the change whose
  3-step mean of the per-step mean length is above every one of the 20 steps before the change.
  No detector can flag the length before it moves; the alert's delay is this lag plus its own.

``--keep DIR`` keeps the run folders; ``--replay DIR`` then feeds their logged episodes
(``episodes.sqlite``: the same samples, log-probs and rewards the live monitor saw, step by step)
through a :class:`agentrt.controller.drift.DriftMonitor` with the drift section ``--drift`` gives, in
seconds: a replay with the runs' own section prints the live figures again, so detector settings
are compared on the same runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

CHANGE = 30
SIGNALS = ("response_length", "token_entropy", "topic", "reward")


def pays_for_length(prompt: str, response: str, info: dict) -> float:
    return float(len(response))


def config(run_dir: Path, model: Path, seed: int, steps: int, args: argparse.Namespace) -> dict:
    return {"seed": seed, "run_dir": str(run_dir), "progress": False, "threads": 1,
            "task": {"name": "arithmetic", "train_size": 64, "eval_size": 4,
                     "options": {"digits": 1, "ops": ["+"]}},
            "policy": {"model": {"path": str(model)}, "optim": {"lr": args.lr},
                       "rollout": {"sampling": {"max_new_tokens": 8, "temperature": 1.0}}},
            "sft": {"steps": 100, "batch_size": 16},
            "train": {"steps": steps, "prompts_per_step": args.prompts_per_step,
                      "group_size": args.group_size},
            "eval": {"every": 1000}, "checkpoint": {"every": 5, "keep": 2},
            "drift": {"enabled": True, "action": "log", **args.drift}}


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def train(cfg: dict, start: str = "auto") -> None:
    from agentrt.config.load import validate_config
    from agentrt.workloads.prompts.config import TrainConfig
    from agentrt.workloads.prompts.workload import Trainer

    Trainer(validate_config(cfg, TrainConfig), start=start).run()


def play(kind: str, folder: Path, model: Path, seed: int, args: argparse.Namespace) -> None:
    """One run in this (fresh) process: ``same<seed>`` or ``changed<seed>``."""
    logging.basicConfig(level=logging.ERROR)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.drift importable
    run = folder / f"{kind}{seed}"
    if kind == "same":
        return train(config(run, model, seed, args.steps, args))
    train(config(run, model, seed, CHANGE, args))
    train(config(run, model, seed, CHANGE + args.after, args)
          | {"reward": "bench.drift:pays_for_length"}, start="force")


def steps_of(run: Path) -> dict[int, list[Any]]:
    """The run's logged episodes per step, as the trajectories the monitor reads."""
    from agentrt.controller.episodes import EpisodeLog

    out: dict[int, list[Any]] = {}
    for e in EpisodeLog(run):
        turn = SimpleNamespace(response_ids=e.response_ids, logprobs=e.logprobs, text=e.response)
        out.setdefault(e.step, []).append(
            SimpleNamespace(policy_id=e.policy_id, reward=e.reward, turns=[turn]))
    return out


def monitor(run: Path, drift: dict) -> tuple[list[dict], list[dict]]:
    """(per checked step its drift/ metrics, the events): the run's episodes through a monitor
    with the drift section ``drift`` (action log)."""
    from agentrt.config.drift import DriftConfig
    from agentrt.controller.drift import DriftMonitor

    steps = steps_of(run)
    texts = {tuple(t.response_ids): t.text for tr in sum(steps.values(), []) for t in tr.turns}
    with tempfile.TemporaryDirectory() as tmp:
        mon = DriftMonitor(DriftConfig.model_validate({"enabled": True, **drift,
                                                       "action": "log"}),
                           Path(tmp), lambda pid, ids: texts[tuple(ids)])
        rows = []
        for step in sorted(steps):
            metrics = mon.observe(step, steps[step])
            if metrics:
                rows.append({"step": step, **metrics})
        return rows, read(mon.events)


def live(run: Path) -> tuple[list[dict], list[dict]]:
    """The same as :func:`monitor`, read from the run's own metrics.jsonl and drift.jsonl."""
    rows = [r for r in read(run / "metrics.jsonl") if any(k.startswith("drift/") for k in r)]
    return rows, read(run / "drift.jsonl")


def alarms(rows: list[dict], events: list[dict]) -> dict[str, tuple]:
    """Per signal, (alerts, alerted steps, checked steps)."""
    alerts = [a for a in events if a["event"] == "alert"]
    return {s: (sum(a["signal"] == s for a in alerts),
                sum(r.get(f"drift/{s}/alert", 0) for r in rows), len(rows)) for s in SIGNALS}


def length_moved(run: Path) -> int | None:
    """The first step after the change whose 3-step mean length is above all 20 before it."""
    mean = {s: float(np.mean([len(t.turns[0].response_ids) for t in trs]))
            for s, trs in steps_of(run).items()}
    top = max(mean[s] for s in range(CHANGE - 19, CHANGE + 1))
    for s in range(CHANGE + 1, max(mean) - 1):
        if (mean[s] + mean[s + 1] + mean[s + 2]) / 3 > top:
            return s - CHANGE
    return None


def report(folder: Path, seeds: list[int], drift: dict | None, args: argparse.Namespace) -> None:
    """Prints the tables; ``drift`` None: the runs' live monitor, else a replay with it."""
    def get(run: Path) -> tuple[list[dict], list[dict]]:
        return live(run) if drift is None else monitor(run, drift)

    same = {seed: alarms(*get(folder / f"same{seed}")) for seed in seeds}
    before, delays, moved = {}, {}, {}
    for seed in seeds:
        run = folder / f"changed{seed}"
        rows, events = get(run)
        before[seed] = alarms([r for r in rows if r["step"] <= CHANGE],
                              [e for e in events if e["step"] <= CHANGE])
        first: dict[str, int | None] = {s: None for s in SIGNALS}
        for a in events:
            if a["event"] == "alert" and a["step"] > CHANGE and first[a["signal"]] is None:
                first[a["signal"]] = a["step"] - CHANGE
        delays[seed], moved[seed] = first, length_moved(run)

    print(f"\n{'live monitor' if drift is None else 'replayed with drift ' + json.dumps(drift)}"
          f"\nno change: {len(seeds)} runs x {args.steps} steps")
    print(f"{'signal':16} {'runs alerted':>12} {'alerts':>7} {'flagged/checked':>16}")
    for s in SIGNALS:
        runs = sum(same[seed][s][0] > 0 for seed in seeds)
        alerts = sum(same[seed][s][0] for seed in seeds)
        flagged = sum(same[seed][s][1] for seed in seeds)
        checked = sum(same[seed][s][2] for seed in seeds)
        print(f"{s:16} {runs:>5} of {len(seeds):<4} {alerts:>7} "
              f"{flagged / max(checked, 1):>16.4f}")
    total = sum(same[seed][s][0] for seed in seeds for s in SIGNALS)
    checked = sum(same[seed]["reward"][2] for seed in seeds)
    print(f"false-alarm rate: {total} alerts in {checked} checked steps "
          f"({total / max(checked, 1):.4f} per step, all signals)")
    print("alerts per run without change: " + " ".join(
        f"{seed}:{sum(same[seed][s][0] for s in SIGNALS)}" for seed in seeds))
    early = {s: sum(before[seed][s][0] for seed in seeds) for s in SIGNALS}
    checked = sum(before[seed]["reward"][2] for seed in seeds)
    print(f"and before the change in the changed runs: {sum(early.values())} alerts in "
          f"{checked} checked steps (" + ", ".join(f"{s} {n}" for s, n in early.items()) + ")")
    print(f"\nreward changed at step {CHANGE} to pay for length: steps to the first alert "
          f"(- none in {args.after})")
    print(f"{'signal':16} " + " ".join(f"{'seed ' + str(s):>7}" for s in seeds))
    for s in SIGNALS:
        print(f"{s:16} " + " ".join(f"{'-' if delays[seed][s] is None else delays[seed][s]:>7}"
                                    for seed in seeds))
    print(f"{'length moved':16} " + " ".join(f"{'-' if moved[seed] is None else moved[seed]:>7}"
                                             for seed in seeds))
    within = sum(d["response_length"] is not None and d["response_length"] <= 20
                 for d in delays.values())
    print(f"response_length alert within 20 steps of the change: {within} of {len(seeds)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--steps", type=int, default=200, help="steps of a run without change")
    ap.add_argument("--after", type=int, default=40, help="steps after the reward change")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4, help="samples per prompt")
    ap.add_argument("--drift", type=json.loads, default={},
                    help="JSON on top of the drift section's defaults, e.g. '{\"patience\": 4}'")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (fresh processes)")
    ap.add_argument("--keep", type=Path, help="keep the run folders here (default: a temp dir)")
    ap.add_argument("--replay", type=Path, help="replay the kept runs of a --keep folder "
                    "through a monitor with --drift (the seeds found there)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.replay is not None:
        seeds = sorted(int(p.name[4:]) for p in args.replay.glob("same*"))
        args.steps = max(steps_of(args.replay / f"same{seeds[0]}"))
        args.after = max(steps_of(args.replay / f"changed{seeds[0]}")) - CHANGE
        return report(args.replay, seeds, args.drift, args)
    from agentrt.policies.models import build_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) if args.keep is None else args.keep
        model = build_model(folder / "llama-nano", "llama-nano", seed=0)
        with ProcessPoolExecutor(args.jobs, multiprocessing.get_context("spawn")) as pool:
            runs = [pool.submit(play, kind, folder, model, seed, args)
                    for kind in ("changed", "same") for seed in args.seeds]
            for r in runs:
                r.result()
        print(f"lr {args.lr:g}, {args.prompts_per_step} prompts x {args.group_size} samples a "
              f"step")
        report(folder, args.seeds, None, args)


if __name__ == "__main__":
    main()
