"""``make demo`` and the arithmetic GRPO bench: this checkout against an earlier commit.

Issue 16's before/after in one run. Two workloads, each run by two code bases (this checkout and
``--old``, default ae9df8f^: the code when the issue was filed), every arm in a fresh process,
arms alternating order from repetition to repetition:

- league: examples/ttt_league.yaml as ``make demo`` runs it (warm start, PFSP league, greedy
  evaluation every 20 steps against random and minimax, checkpoints); league steps per minute
  are train steps over the wall time after the warm start (evaluations and checkpoints in).
- arith: examples/arith_grpo.yaml as bench/grpo_arith.py runs it (SFT warm start, then GRPO);
  its figure is the whole run's wall time.

The first repetition runs both workloads in full: the learning figures (league win rate against
random at the last evaluation, arithmetic held-out exact-match gain in points) come from it.
Later repetitions (``--reps``) run the league for ``--league-steps`` steps and the arithmetic
bench in full again, for more speed ratios. Threads are the config's (unset: tuned, as
``make demo``) unless ``--threads`` pins them. Prints per arm the speed, where a step's time goes
(rollout, train, the rest: evaluation, checkpoints, snapshots) and the new/old ratios.

Run: ``.venv/bin/python bench/speedup.py [--old COMMIT] [--reps 3] [--league-steps 40]``
(``--new-set P.packing=false`` adds a third arm: this checkout with an override; ``--set`` applies
one to every arm.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from oldcode import ROOT, export, run_arm

ARM = r"""
import json, resource, sys, time
from pathlib import Path
import agentrt
try:  # this checkout's layout
    from agentrt.config.load import load_config
    from agentrt.workloads.prompts.config import TrainConfig
    from agentrt.workloads.prompts.workload import Trainer
except ImportError:  # agentrt before the house move (flat modules)
    from agentrt.config import TrainConfig, load_config
    from agentrt.trainer import Trainer
kind, config, overrides = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
if kind == "league":
    from agentrt.tournaments.run_config import TournamentRunConfig
    from agentrt.tournaments.trainer import LeagueTrainer as Run
    cfg = load_config(config, overrides, model=TournamentRunConfig)
else:
    Run = Trainer
    cfg = load_config(config, overrides, model=TrainConfig)
start = time.perf_counter()
Run(cfg).run()
seconds = time.perf_counter() - start
rows = [json.loads(x) for x in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
key = "eval/win_rate_vs_random" if kind == "league" else "eval/accuracy"
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({
    "seconds": seconds, "steps": rows[-1]["step"], "code": agentrt.__file__,
    "cpu": usage.ru_utime + usage.ru_stime,
    "warm": rows[0].get("timing_s/warm_start", rows[0].get("timing_s/sft", 0.0)),
    "rollout": sum(r.get("timing_s/rollout", 0.0) for r in rows[1:]),
    "train": sum(r.get("timing_s/train", 0.0) for r in rows[1:]),
    "evals": [(r["step"], r[key]) for r in rows if key in r],
    "threads": sorted({r["perf/threads"] for r in rows if "perf/threads" in r})}))
"""

CONFIGS = {"league": ROOT / "examples" / "ttt_league.yaml",
           "arith": ROOT / "examples" / "arith_grpo.yaml"}


def arm(code: str, kind: str, run_dir: Path, extra: list[str], name: str) -> dict:
    overrides = [f"run_dir={run_dir}", "progress=false", *extra]
    res = run_arm(ARM, code, [kind, str(CONFIGS[kind]), json.dumps(overrides)], name)
    loop = res["seconds"] - res["warm"]
    res["steps_per_min"] = 60 * res["steps"] / loop
    res["learning"] = (100 * res["evals"][-1][1] if kind == "league"
                       else 100 * (res["evals"][-1][1] - res["evals"][0][1]))
    print(f"  {name:<24} {res['steps']:4d} steps {res['seconds']:7.1f} s wall "
          f"({res['cpu']:6.1f} CPU s), warm start {res['warm']:6.1f} s, "
          f"{res['steps_per_min']:6.1f} steps/min; per step rollout "
          f"{res['rollout'] / res['steps']:.3f} s, train {res['train'] / res['steps']:.3f} s, "
          f"rest {(loop - res['rollout'] - res['train']) / res['steps']:.3f} s; "
          f"{'win rate vs random' if kind == 'league' else 'gain'} {res['learning']:.1f}"
          f"{'%' if kind == 'league' else ' points'}; threads {res['threads']}", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="ae9df8f^", help="The commit to compare with.")
    ap.add_argument("--reps", type=int, default=3,
                    help="Repetitions; the first runs both workloads in full.")
    ap.add_argument("--league-steps", type=int, default=40,
                    help="League steps of the repetitions after the first.")
    ap.add_argument("--no-full", action="store_true",
                    help="Short league runs in every repetition (speed only).")
    ap.add_argument("--threads", type=int, default=None, help="Pin torch threads (both arms).")
    ap.add_argument("--only", choices=("league", "arith"), default=None)
    ap.add_argument("--set", action="append", default=[], dest="both_set",
                    help="An override for every arm ('P.' as for --new-set), e.g. "
                         "P.lora.enabled=true for a LoRA league.")
    ap.add_argument("--new-set", action="append", default=[],
                    help="Adds an arm 'new+': this checkout with this override; 'P.' stands for "
                         "the trained policy (policies.0. in the league, policy. in arith).")
    args = ap.parse_args()
    pin = [f"threads={args.threads}"] if args.threads else []
    pin += args.both_set
    kinds = [args.only] if args.only else ["league", "arith"]
    print(f"cpus {os.cpu_count()}, load average at start {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="speedup-") as tmp:
        codes = {"old": str(export(args.old, Path(tmp) / "old")), "new": "-"}
        names = ["old", "new"] + (["new+"] if args.new_set else [])
        res: dict[tuple[str, str, bool], list[dict]] = {}
        for r in range(args.reps):
            full = r == 0 and not args.no_full
            print(f"repetition {r} ({'full runs' if full else 'short league'}), load average "
                  f"{os.getloadavg()[0]:.2f}", flush=True)
            for kind in kinds:
                extra = pin + ([] if full or kind == "arith"
                               else [f"train.steps={args.league_steps}"])
                prefix = "policies.0." if kind == "league" else "policy."
                added = [o.replace("P.", prefix, 1) if o.startswith("P.") else o
                         for o in args.new_set]
                extra = [o.replace("P.", prefix, 1) if o.startswith("P.") else o for o in extra]
                order = names[r % len(names):] + names[:r % len(names)]
                for name in order:
                    out = arm(codes.get(name, "-"), kind, Path(tmp) / f"{kind}-{name}-{r}",
                              extra + (added if name == "new+" else []),
                              f"{kind} {name}{' (' + args.old + ')' if name == 'old' else ''}")
                    res.setdefault((kind, name, full or kind == "arith"), []).append(out)
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
    report(res, args)


def report(res: dict[tuple[str, str, bool], list[dict]], args: argparse.Namespace) -> None:
    """Medians and ratios to ``old``: league steps/min (full run, short runs), arith wall time."""
    print(f"\nnew = this checkout, old = {args.old}"
          + (f", new+ = new with {' '.join(args.new_set)}" if args.new_set else ""))

    def ratio(kind: str, full: bool, field: str, invert: bool, name: str) -> None:
        old, new = res.get((kind, "old", full)), res.get((kind, name, full))
        if not old or not new:
            return
        per = [(o[field] / n[field]) if invert else (n[field] / o[field])
               for o, n in zip(old, new)]
        mo = statistics.median(o[field] for o in old)
        mn = statistics.median(n[field] for n in new)
        label = {"league": "league steps/min" + (" (full)" if full else
                                                 f" ({args.league_steps} steps)"),
                 "arith": "arith bench wall s"}[kind]
        # CPU seconds per step (league) or per run (arith): steadier than wall time under load
        cpu = [(o["cpu"] / o["steps"]) / (n["cpu"] / n["steps"]) for o, n in zip(old, new)]
        print(f"{label:<28} old {mo:8.1f}  {name:<4} {mn:8.1f}  {name}/old speed "
              f"{statistics.median(per):.2f}x (per repetition "
              f"{', '.join(f'{p:.2f}' for p in per)}), per CPU second "
              f"{statistics.median(cpu):.2f}x, {len(per)} run(s) per arm")

    for name in ("new", "new+"):
        ratio("league", True, "steps_per_min", False, name)
        ratio("league", False, "steps_per_min", False, name)
        ratio("arith", True, "seconds", True, name)
    for kind, label in (("league", "league win rate vs random (full run)"),
                        ("arith", "arith gain, points (every run)")):
        for name in ("old", "new", "new+"):
            runs = res.get((kind, name, True), [])
            if runs:
                print(f"{label:<38} {name}: "
                      + ", ".join(f"{x['learning']:.1f}" for x in runs))


if __name__ == "__main__":
    main()
