"""The default thread count against ``threads: 1``, on a quiet and on a shared machine.

The arithmetic GRPO job (examples/arith_grpo.yaml: llama-tiny, 32 prompts x 8 completions per
step, no SFT here) runs a few timed steps in a fresh process per arm: ``default`` leaves
``threads`` unset (agentrt.runtime.threads tunes it), ``threads=1`` pins one thread. Arms alternate,
rounds repeat, medians are compared. Two conditions, in one run: as the machine is, and with a
busy process spinning on one core for the whole arm (a second job on a shared 2-core box).
Prints seconds per step of each arm, the ratio default/threads=1 of steps per second (>= 1.0:
the default is not slower), the thread count the tuner chose, the counts it timed at its last
check in each round ([] where no CPU was spare: it ran one thread, untimed, as ``threads=1``
does), the ratio of the CPU seconds per step the arms' processes used (the work they did,
which the other processes on the machine move less than the wall time) and the load average.
``--same`` pins ``threads=1`` in the default arm too: the ratio then shows how far two
identical arms differ on the machine as it is.

Run: ``.venv/bin/python bench/threads.py [--rounds 3] [--steps 12] [--same]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "arith_grpo.yaml"

ARM = r"""
import json, sys, time
from agentrt.config.load import load_config
from agentrt.workloads.prompts.config import TrainConfig
from agentrt.workloads.prompts.workload import Trainer
overrides, steps = json.loads(sys.argv[1]), int(sys.argv[2])
cfg = load_config(sys.argv[3], overrides, TrainConfig)
Trainer(cfg).run(stop_after=0)  # model build, tuning, step-0 eval and checkpoint: not timed
trainer = Trainer(load_config(sys.argv[3], overrides + [f"train.steps={steps}"], TrainConfig))
start, cpu = time.perf_counter(), time.process_time()
trainer.run()
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
rows = [json.loads(l) for l in (trainer.run_dir.path / "metrics.jsonl").read_text().splitlines()]
tuner = trainer.controller.tuner  # None when pinned; a count timed at the last check took > 0 s
timed = [n for n, t in tuner.last.items() if t > 0] if tuner is not None else []
print(json.dumps({"seconds": seconds, "cpu": cpu, "timed": timed,
                  "threads": [r.get("perf/threads") for r in rows[1:]]}))
"""

BUSY = "while True: pass"


def run_arm(pinned: bool, steps: int, run_dir: Path) -> dict:
    overrides = [f"run_dir={run_dir}", "progress=false", "sft.steps=0", "eval.every=1000",
                 "checkpoint.every=1000", "task.eval_size=8"]
    if pinned:
        overrides.append("threads=1")
    out = subprocess.run([sys.executable, "-c", ARM, json.dumps(overrides), str(steps),
                          str(CONFIG)], check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(rounds: int, steps: int, busy: bool, same: bool = False) -> dict[str, list]:
    spinner = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
    times: dict[str, list] = {"default": [], "threads=1": [], "chosen": [], "timed": [],
                              "cpu default": [], "cpu threads=1": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(rounds):
                for arm in (("default", "threads=1") if r % 2 == 0 else ("threads=1", "default")):
                    res = run_arm(same or arm == "threads=1", steps, Path(tmp) / f"{arm}-{r}")
                    times[arm].append(res["seconds"] / steps)
                    times[f"cpu {arm}"].append(res["cpu"] / steps)
                    if arm == "default":
                        times["chosen"].extend(res["threads"])
                        times["timed"].append(res["timed"])
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--same", action="store_true", help="threads=1 in both arms (A/A control)")
    args = ap.parse_args()
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}; {args.rounds} rounds "
          f"x {args.steps} GRPO steps per arm, fresh process per arm"
          + ("; --same: threads=1 in both arms" if args.same else ""))
    for busy in (False, True):
        t = measure(args.rounds, args.steps, busy, args.same)
        d, one = statistics.median(t["default"]), statistics.median(t["threads=1"])
        chosen = sorted({int(c) for c in t["chosen"] if c is not None})
        pairs = list(zip(t["threads=1"], t["default"]))
        cpu = statistics.median(t["cpu default"]) / statistics.median(t["cpu threads=1"])
        print(f"{'one core busy' if busy else 'as the machine is':18s} default {1 / d:6.3f} "
              f"steps/s ({d:.2f} s/step, tuner chose {chosen}, timed per round {t['timed']}), "
              f"threads=1 {1 / one:6.3f} "
              f"steps/s ({one:.2f} s/step), default/threads=1 steps per second: "
              f"{one / d:.2f}x (per round {', '.join(f'{o / x:.2f}' for o, x in pairs)}); "
              f"CPU s/step default/threads=1 {cpu:.2f}x; "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
