"""League steps per minute: the controller runtime against the pre-runtime league loop.

``make demo``'s config (examples/ttt_league.yaml) run for a few steps by two code bases, side by
side in one run: this checkout (one controller loop, the learner in a pool, snapshots as CPU
weights swapped into the live model) and the commit before the runtime landed (8857db1: its own
loop, one Learner per policy, snapshots as deep-copied models served by their own HF
rollout). The old code is exported with ``git archive`` and installed into a temporary folder;
each arm runs in its own subprocess with the same threads and seed, arms alternate, and the
first round of each arm is a warm-up. Prints seconds per step (median over rounds) and the ratio.

Run: ``.venv/bin/python bench/league_speed.py [--rounds 3] [--steps 6] [--old COMMIT]``
(bench/speedup.py runs the whole ``make demo`` and the arithmetic bench against ae9df8f^.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from oldcode import ROOT, export, run_arm

OLD_COMMIT = "8857db1"

ARM = r"""
import json, sys, time
try:  # this checkout's layout
    from agentrt.config.load import load_config
except ImportError:  # agentrt before the house move (flat modules)
    from agentrt.config import load_config
from agentrt.tournaments.run_config import TournamentRunConfig
from agentrt.tournaments.trainer import LeagueTrainer
import agentrt
overrides = json.loads(sys.argv[2])
cfg = load_config(sys.argv[3], overrides, model=TournamentRunConfig)
trainer = LeagueTrainer(cfg)
trainer.run(stop_after=0)  # warm start, step-0 eval and checkpoint: not timed
start = time.perf_counter()
trainer2 = LeagueTrainer(cfg.model_copy(update={"train": cfg.train.model_copy(
    update={"steps": int(sys.argv[4])})}))
trainer2.run()
print(json.dumps({"seconds": time.perf_counter() - start, "code": agentrt.__file__}))
"""


def shared_config(dest: Path) -> Path:
    """The example without its ``runtime:`` section (the old code has none; local either way)."""
    import yaml

    data = yaml.safe_load((ROOT / "examples" / "ttt_league.yaml").read_text())
    data.pop("runtime", None)
    path = dest / "ttt_league.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def league_arm(old: str, config: Path, run_dir: Path, steps: int, threads: int) -> float:
    """Seconds for ``steps`` league steps after the warm start (fresh run folder)."""
    overrides = [f"run_dir={run_dir}", "progress=false", f"threads={threads}",
                 "warm_start.steps=20", "eval.every=1000", "eval.games=8",
                 "checkpoint.every=1000", f"train.steps={steps}"]
    out = run_arm(ARM, old, [json.dumps(overrides), str(config), str(steps)],
                  "old" if old != "-" else "new")
    return float(out["seconds"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="Timed rounds per arm (after one warm-up).")
    ap.add_argument("--steps", type=int, default=6, help="League steps timed per round.")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of both arms.")
    ap.add_argument("--old", default=OLD_COMMIT, help="The commit to compare with.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="league-speed-") as tmp:
        old = str(export(args.old, Path(tmp) / "old"))
        config = shared_config(Path(tmp))
        times: dict[str, list[float]] = {"old": [], "new": []}
        for r in range(args.rounds + 1):
            for name, code in (("old", old), ("new", "-")):
                seconds = league_arm(code, config, Path(tmp) / f"{name}{r}", args.steps,
                                     args.threads)
                if r:  # round 0 warms the file cache and pip's byte-compiled modules
                    times[name].append(seconds / args.steps)
                print(f"round {r} {name}: {seconds / args.steps:.3f} s/step"
                      + ("  (warm-up)" if not r else ""), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nexamples/ttt_league.yaml, {args.steps} steps x {args.rounds} rounds, "
          f"{args.threads} threads")
    print(f"{'code':<28}{'s/step':>8}{'steps/min':>11}")
    print(f"{'before (' + args.old + ')':<28}{med['old']:>8.3f}{60 / med['old']:>11.1f}")
    print(f"{'controller runtime':<28}{med['new']:>8.3f}{60 / med['new']:>11.1f}")
    ratio = med["old"] / med["new"]
    print(f"steps/min ratio new/old: {ratio:.2f}x (>= 1.00 means no slower)")


if __name__ == "__main__":
    main()
