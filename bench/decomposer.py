"""Do chained specialists beat one generalist at the same number of training samples?

For each task family, both arms in this one run, same model preset, same seeds, same held-out
tasks:

- ``generalist``: one policy does each whole task in one answer (``planner.kind: single``);
- ``decomposer``: the rule planner splits each task, the router sends each subtask to its
  specialist (one policy per group of subtask types), the chain's output is the answer.

Each arm gets the same SFT budget in samples (split over the specialists by ``SHARES``), then RL with the same number of trajectories per step (the generalist plays as
many more tasks per step as a chain has subtasks). The samples each arm trained on are counted
from its metrics and printed. Held-out task success gets a 95% confidence interval (Wilson per
arm; the difference by the normal approximation for two proportions).

Then the LM planner (must-show 2): a planner policy with a short SFT warm start learns by RL on
the task outcome, chaining the specialists the decomposer arm trained (frozen); its held-out
plan validity and task success are printed before training, after the warm start and at the end.

Splits and seeds: the task generator's seed picks the split (``--split validation``: family seed
1000, where settings such as ``SHARES`` are chosen; ``--split test``: family seed 1234, where
figures are reported); each split has its own training tasks and held-out tasks, disjoint. Every
arm trains once per training seed (``--seeds``) and is evaluated on the same held-out tasks; the
difference of two arms is the mean over seeds and tasks, with a 95% interval from a bootstrap
that resamples seeds and tasks (crossed: every seed is evaluated on every task).

``--routing`` (on wordchain, per training seed): routing among trained candidates. Four
specialists are warm-started on slices of the rows (``CANDIDATES``: two readers on different
templates, two calculators on different operations; ``sft_match``), then frozen, and the same
held-out tasks are played with routing fixed to one candidate per type (``fixed 1``, ``fixed
2``) and with the router choosing among all four after learning from ``--routing-steps`` steps
of training chains, by its per-type ratings alone or with the memory of similar past subtasks.
The router reads only the outcomes: not the slices.

``shopping`` (a tool-using family) adds the arm ``no-tool``: the decomposer with an LM specialist
doing the price lookups instead of the shop's tool (same SFT budget over its LM specialists).

    .venv/bin/python bench/decomposer.py [--families wordchain eventplan shopping]
        [--seeds 1 2 3] [--split test|validation] [--sft-samples 80000] [--json OUT.json]
        [--routing [--routing-steps 8]]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrt.config.load import validate_config
from agentrt.decomposer.config import DecomposeConfig
from agentrt.decomposer.workload import Decomposer

GROUPS = {"wordchain": {"reader": ["parse", "format"], "calc": ["add", "sub", "mul", "div"]},
          "eventplan": {"selector": ["select"], "scheduler": ["schedule"], "writer": ["script"]},
          "shopping": {"reader": ["parse"], "calc": ["cost", "sum"]}}
# The shop's price tool (a Python specialist, never trained) and, in the no-tool arm, the LM
# specialist that does its job instead.
TOOLS = {"shopping": [{"id": "shop", "fn": "agentrt.decomposer.families.shopping:lookup_tool",
                       "skills": ["lookup"]}]}
NO_TOOL = {"shopping": {"looker": ["lookup"]}}
SPLITS = {"validation": 1000, "test": 1234}  # family seed of each split
# How the decomposer arm splits the SFT budget over its specialists: a choice of that arm, made
# by how hard each subtask is (selecting under a budget and a window is the hardest part of an
# event plan, copying prices into a script the easiest; copying numbers out of a sentence is easy
# and the arithmetic is not); the total equals the generalist's.
SHARES = {"wordchain": {"reader": 0.2, "calc": 0.8},
          "eventplan": {"selector": 0.5, "scheduler": 0.35, "writer": 0.15},
          # set before any run (as wordchain's): reading a bill is copying, the costs and the
          # sum are the arithmetic; without the tool a third learns the price list
          "shopping": {"reader": 0.2, "calc": 0.8},
          "shopping/no-tool": {"reader": 0.2, "looker": 0.3, "calc": 0.5}}


# Routing among trained candidates (``--routing``), on wordchain: two readers warm-started on
# different templates (a split by content: per subtask type they are about as good, so only the
# memory of similar past subtasks can tell them apart) and two calculators on different
# operations (a split by type, which the per-type ratings can find). Each gets its share of the
# same SFT budget (id -> skills, the rows it is warm-started on, share); set before any run.
CANDIDATES = {"reader1": (("parse", "format"), "bags of|shares them|away and buys", 0.2),
              "reader2": (("parse", "format"), "rows of|finds|loses", 0.2),
              "calc1": (("add", "sub", "mul", "div"), r"^(add|sub) ", 0.3),
              "calc2": (("add", "sub", "mul", "div"), r"^(mul|div) ", 0.3)}
# How the frozen candidates are routed: fixed to one candidate per type (the first or the second
# of each pair), or by the router learning from the outcomes of --routing-steps steps of chains.
ROUTES = {"fixed 1": {"only": ("reader1", "calc1")}, "fixed 2": {"only": ("reader2", "calc2")},
          "ratings": {"router": {"memory": False}},
          "ratings+memory": {"router": {"memory": True}}}


def policy(pid: str, skills: list[str], max_new_tokens: int = 64, **extra: Any) -> dict:
    return {"id": pid, "skills": skills, "model": {"preset": "llama-tiny"},
            "rollout": {"sampling": {"temperature": 1.0, "max_new_tokens": max_new_tokens}},
            "optim": {"lr": 5e-5, "max_grad_norm": 1.0},
            "algorithm": {"name": "grpo", "kl": {"coef": 0.0}}, "micro_batch_size": 256,
            **extra}


def config(run_dir: Path, family: str, arm: str, args: argparse.Namespace,
           tasks_per_step: int, seed: int = 0, **over: Any) -> DecomposeConfig:
    batch = 64
    sft_steps = args.sft_samples // batch
    tasks, tools = tasks_per_step, []
    if arm == "generalist":
        policies = [policy("generalist", ["solve"])]
        planner = {"kind": "single"}
    else:
        groups, shares = dict(GROUPS[family]), SHARES[family]
        if arm == "no-tool":
            groups, shares = {**groups, **NO_TOOL[family]}, SHARES[f"{family}/no-tool"]
        else:
            tools = TOOLS.get(family, [])
        policies = [policy(pid, skills, sft_steps=int(sft_steps * shares[pid]))
                    for pid, skills in groups.items()]
        planner = {"kind": "rule"}
    data = {"seed": seed, "run_dir": str(run_dir), "threads": args.threads,
            "family": {"name": family, "train_size": 4000, "eval_size": args.eval_size,
                       "seed": SPLITS[args.split]},
            "planner": planner, "policies": policies, "tools": tools,
            "sft": {"steps": sft_steps, "batch_size": batch, "lr": 1e-3, "warmup_steps": 20},
            "train": {"steps": args.rl_steps, "tasks_per_step": tasks, "group_size": 4},
            # every held-out chain kept at each evaluation: per-task outcomes for the interval
            "eval": {"every": max(1, args.rl_steps), "examples": args.eval_size},
            "checkpoint": {"every": max(1, args.rl_steps), "keep": 1}, "progress": False}
    data.update(over)
    return validate_config(data, DecomposeConfig)


def run(cfg: DecomposeConfig) -> tuple[list[dict[str, Any]], float]:
    start = time.perf_counter()
    Decomposer(cfg).run()
    rows = [json.loads(x) for x in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    return rows, time.perf_counter() - start


def samples(cfg: DecomposeConfig, rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(SFT rows, RL trajectories) the arm trained on, from its config and metrics."""
    sft = sum((p.sft_steps if p.sft_steps is not None else cfg.sft.steps) * cfg.sft.batch_size
              for p in cfg.policies if p.trainable)
    rl = int(sum(r.get("rollout/trajectories", 0) for r in rows if r["step"] > 0))
    return sft, rl


def under(row: dict[str, Any], prefix: str) -> dict[str, float]:
    """The metrics of ``row`` named ``prefix<name>``, by name."""
    return {k.removeprefix(prefix): v for k, v in row.items() if k.startswith(prefix)}


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def outcomes(run_dir: str) -> dict[str, bool]:
    """Task id -> success of every held-out chain of the run's last evaluation."""
    last = (Path(run_dir) / "eval_chains.jsonl").read_text().splitlines()[-1]
    return {c["task_id"]: bool(c["success"]) for c in json.loads(last)["chains"]}


ARMS = ("decomposer", "no-tool", "generalist")


def arms_of(family: str, only: list[str] | None = None) -> tuple[str, ...]:
    """The arms ``family`` has (``only``: those of them named), in the order they train."""
    return tuple(a for a in ARMS if (a != "no-tool" or family in NO_TOOL)
                 and (only is None or a in only))


def compare(family: str, args: argparse.Namespace, root: Path, seed: int) -> dict[str, Any]:
    """Every arm of ``family`` trained with training seed ``seed``, on the same tasks."""
    out: dict[str, Any] = {}
    tasks = args.tasks_per_step  # the generalist's: set from the decomposer's trajectories
    for arm in arms_of(family, args.arms):
        cfg = config(root / f"{family}_{arm}_seed{seed}", family, arm, args, seed=seed,
                     tasks_per_step=tasks if arm == "generalist" else args.tasks_per_step)
        rows, seconds = run(cfg)
        evals = [r for r in rows if "eval/success" in r]
        out[arm] = {"success": evals[-1]["eval/success"], "start": evals[0]["eval/success"],
                    "samples": samples(cfg, rows), "seconds": seconds, "run_dir": cfg.run_dir,
                    "outcomes": outcomes(cfg.run_dir),
                    "subtasks": under(evals[-1], "eval/subtask_success/")}
        if arm == "decomposer" and args.rl_steps:
            # The generalist trains on as many RL trajectories per step as the chains gave
            # (one per subtask attempt): that many whole tasks per step.
            per_step = out[arm]["samples"][1] / args.rl_steps
            tasks = max(1, round(per_step / cfg.train.group_size))
    n = args.eval_size
    print(f"\n== {family}, training seed {seed} ({args.split} split): held-out task success on "
          f"{n} tasks ==")
    print(f"{'arm':<12} {'after SFT':>9} {'final':>7} {'95% CI':>15} {'SFT rows':>9} "
          f"{'RL traj':>8} {'seconds':>8}")
    for arm in reversed(arms_of(family, args.arms)):
        r = out[arm]
        lo, hi = (max(0.0, x) for x in wilson(r["success"], n))
        print(f"{arm:<12} {r['start']:9.3f} {r['success']:7.3f} [{lo:.3f}, {hi:.3f}] "
              f"{r['samples'][0]:9d} {r['samples'][1]:8d} {r['seconds']:8.0f}")
    for arm in (a for a in arms_of(family, args.arms) if a != "generalist"):
        print(f"{arm} subtask success: " + ", ".join(
            f"{k} {v:.2f}" for k, v in sorted(out[arm]["subtasks"].items())))
    return out


def crossed_interval(a: list[dict[str, bool]], b: list[dict[str, bool]], reps: int = 4000,
                     seed: int = 0) -> tuple[float, float, float]:
    """Mean over seeds and tasks of arm a's success minus arm b's (``a[i]``, ``b[i]``: seed
    i's outcome per task) and a 95% bootstrap interval resampling seeds and tasks (crossed:
    one draw of seeds, one of tasks, each replicate)."""
    tasks = sorted(set(a[0]) & set(b[0]))
    diff = [[float(x[t]) - float(y[t]) for t in tasks] for x, y in zip(a, b)]
    rng = random.Random(seed)
    means = []
    for _ in range(reps):
        seeds = [rng.randrange(len(diff)) for _ in diff]
        picks = [rng.randrange(len(tasks)) for _ in tasks]
        means.append(sum(diff[s][t] for s in seeds for t in picks) / (len(seeds) * len(picks)))
    means.sort()
    mean = sum(map(sum, diff)) / (len(diff) * len(tasks))
    return mean, means[int(0.025 * reps)], means[int(0.975 * reps) - 1]


def summarize(family: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The family's differences over all training seeds (mean, 95% interval)."""
    arms = [a for a in arms_of(family) if a in runs[0]]
    pairs = [(a, b) for a, b in [("decomposer", "generalist"), ("decomposer", "no-tool"),
                                 ("no-tool", "generalist")] if a in arms and b in arms]
    out: dict[str, Any] = {arm: [r[arm]["success"] for r in runs] for arm in arms}
    print(f"\n== {family}: {len(runs)} training seeds x {len(runs[0][arms[0]]['outcomes'])}"
          " held-out tasks ==")
    for arm in arms:
        print(f"{arm:<12} success per seed: {', '.join(f'{x:.3f}' for x in out[arm])}")
    for a, b in pairs:
        mean, lo, hi = crossed_interval([r[a]["outcomes"] for r in runs],
                                        [r[b]["outcomes"] for r in runs])
        out[f"{a} - {b}"] = (mean, lo, hi)
        print(f"{a} - {b}: {mean:+.3f}  95% CI [{lo:+.3f}, {hi:+.3f}] (seeds and tasks)")
    return out


def planner_arm(family: str, specialists_dir: Path, args: argparse.Namespace, root: Path,
                seed: int) -> dict[str, Any]:
    """An LM planner with a short warm start, trained by RL over frozen trained specialists."""
    frozen = [policy(pid, skills, model={"path": str(specialists_dir / "final" / pid)},
                     trainable=False) for pid, skills in GROUPS[family].items()]
    planner = policy("planner", [], sft_steps=args.planner_sft_steps)
    # At temperature 1 a briefly warm-started planner samples almost no valid plan, so every
    # reward is 0 and GRPO has nothing to learn from; a cooler sampler explores near its plans
    # (at 0.7 about half of them parse at the start of RL).
    planner["rollout"]["sampling"]["temperature"] = args.planner_temperature
    planner["optim"] = {"lr": args.planner_lr, "max_grad_norm": 1.0}
    cfg = config(root / f"{family}_planner", family, "decomposer", args, 32, seed=seed,
                 planner={"kind": "lm", "policy": "planner"}, policies=[planner, *frozen],
                 train={"steps": args.planner_steps, "tasks_per_step": 32, "group_size": 4},
                 eval={"every": max(1, args.planner_steps // 4), "examples": 4}, tools=[])
    # Before any training: the planner as built (an untrained LM writes no valid plan).
    rows, seconds = run(cfg)
    evals = [(r["step"], r["eval/plan_valid"], r["eval/success"]) for r in rows
             if "eval/success" in r]
    print(f"\n== {family}: LM planner (warm start {args.planner_sft_steps} SFT steps, then RL on "
          "the task outcome; specialists frozen) ==")
    print("step  plan validity  task success")
    for step, valid, success in evals:
        print(f"{step:4d}  {valid:13.3f}  {success:12.3f}")
    print(f"rise from the start to the end of RL: validity {evals[-1][1] - evals[0][1]:+.3f}, "
          f"success {evals[-1][2] - evals[0][2]:+.3f}  ({seconds:.0f} s)")
    return {"evals": evals}


def routing_compare(args: argparse.Namespace, root: Path, seed: int) -> dict[str, Any]:
    """The candidates warm-started on their slices (one run), then frozen and routed each way of
    ``ROUTES`` on the same held-out tasks; only the routing differs between the arms."""
    sft_steps = args.routing_sft_samples // 64
    steps = {"tasks_per_step": args.tasks_per_step, "group_size": 4}
    trained = [policy(pid, list(skills), sft_steps=int(sft_steps * share), sft_match=match)
               for pid, (skills, match, share) in CANDIDATES.items()]
    base = config(root / f"routing_candidates_seed{seed}", "wordchain", "decomposer", args,
                  args.tasks_per_step, seed=seed, policies=trained, train={"steps": 0, **steps})
    run(base)
    out: dict[str, Any] = {}
    for name, route in ROUTES.items():
        ids = route.get("only", tuple(CANDIDATES))
        frozen = [policy(pid, list(CANDIDATES[pid][0]), trainable=False,
                         model={"path": str(Path(base.run_dir) / "final" / pid)}) for pid in ids]
        for p in frozen:  # the router learns from how they act when evaluated: greedily
            p["rollout"]["sampling"]["temperature"] = 0.0
        n = 0 if "only" in route else args.routing_steps
        # After a failed step the chain goes on (its verifiers judge each step by what it was
        # shown), so the router sees outcomes of every type, not only of the first ones.
        cfg = config(root / f"routing_{name.replace(' ', '_')}_seed{seed}", "wordchain",
                     "decomposer", args, args.tasks_per_step, seed=seed, policies=frozen,
                     router={"exploration": "ucb", **route.get("router", {})},
                     chain={"on_failure": "continue"},
                     train={"steps": n, **steps},
                     eval={"every": max(1, n), "examples": args.eval_size},
                     checkpoint={"every": max(1, n), "keep": 1})
        rows, seconds = run(cfg)
        last = [r for r in rows if "eval/success" in r][-1]
        loads = [under(r, "routing/load/") for r in rows]
        out[name] = {"success": last["eval/success"], "seconds": seconds,
                     "outcomes": outcomes(cfg.run_dir), "run_dir": cfg.run_dir,
                     "subtasks": under(last, "eval/subtask_success/"),
                     "load": next((x for x in reversed(loads) if x), {})}
    print(f"\n== routing among trained candidates, training seed {seed} ({args.split} split): "
          f"held-out task success on {args.eval_size} tasks ==")
    print(f"{'routing':<16} {'success':>8}  subtask success; share of the routing steps' traffic")
    for name, r in out.items():
        print(f"{name:<16} {r['success']:8.3f}  " + ", ".join(
            f"{k} {v:.2f}" for k, v in sorted(r["subtasks"].items())) + (
            "; " + ", ".join(f"{k} {v:.2f}" for k, v in r["load"].items()) if r["load"] else ""))
    return out


def routing_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each routed arm against each fixed arm and memory against none, over seeds and tasks."""
    out: dict[str, Any] = {name: [r[name]["success"] for r in runs] for name in ROUTES}
    print(f"\n== routing among trained candidates: {len(runs)} training seeds x "
          f"{len(runs[0]['fixed 1']['outcomes'])} held-out tasks ==")
    for name in ROUTES:
        print(f"{name:<16} success per seed: {', '.join(f'{x:.3f}' for x in out[name])}")
    pairs = [(a, b) for a in ("ratings", "ratings+memory") for b in ("fixed 1", "fixed 2")]
    for a, b in [*pairs, ("ratings+memory", "ratings")]:
        mean, lo, hi = crossed_interval([r[a]["outcomes"] for r in runs],
                                        [r[b]["outcomes"] for r in runs])
        out[f"{a} - {b}"] = (mean, lo, hi)
        print(f"{a} - {b}: {mean:+.3f}  95% CI [{lo:+.3f}, {hi:+.3f}] (seeds and tasks)")
    return out


def machine() -> dict[str, Any]:
    """The commit and machine a result came from."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    return {"commit": commit, "cpus": os.cpu_count(), "load": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="*", default=["wordchain", "eventplan", "shopping"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3],
                    help="Training seeds (every arm trains once per seed).")
    ap.add_argument("--split", choices=sorted(SPLITS), default="test",
                    help="validation: choose settings; test: report figures.")
    ap.add_argument("--sft-samples", type=int, default=80000, help="SFT rows per arm.")
    ap.add_argument("--rl-steps", type=int, default=10)
    ap.add_argument("--tasks-per-step", type=int, default=16, help="Of the decomposer arm.")
    ap.add_argument("--eval-size", type=int, default=300)
    ap.add_argument("--planner-sft-steps", type=int, default=60)
    ap.add_argument("--planner-steps", type=int, default=40,
                    help="LM planner RL steps over the first seed's wordchain specialists "
                         "(0: no planner arm).")
    ap.add_argument("--planner-temperature", type=float, default=0.7)
    ap.add_argument("--planner-lr", type=float, default=1e-4)
    ap.add_argument("--routing", action="store_true",
                    help="Also route four trained candidates (CANDIDATES) fixed and by the router.")
    ap.add_argument("--routing-sft-samples", type=int, default=160000,
                    help="SFT rows of the four candidates together.")
    ap.add_argument("--routing-steps", type=int, default=8,
                    help="Steps of chains the router learns from (the candidates frozen).")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=None,
                    help="Train only these arms (e.g. decomposer, to compare SFT splits on the "
                         "validation split); differences are printed between the arms run.")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="Folder of the runs (default: a temp folder).")
    ap.add_argument("--json", default=None, help="Write the raw results here.")
    ap.add_argument("--shares", action="append", default=[], metavar="KEY:POLICY=SHARE,...",
                    help="Another SFT split for a SHARES key, e.g. wordchain:reader=0.5,calc=0.5 "
                         "(to compare on the validation split).")
    args = ap.parse_args()
    for spec in args.shares:
        key, _, pairs = spec.partition(":")
        SHARES[key] = {pid: float(x) for pid, x in (p.split("=") for p in pairs.split(","))}
        print(f"SFT split of {key}: {SHARES[key]}")
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-decomposer-"))
    raw: dict[str, Any] = {"args": vars(args), **machine(), "runs": {}, "summary": {}}
    for family in args.families:
        runs = [compare(family, args, root, seed) for seed in args.seeds]
        raw["runs"][family] = runs
        raw["summary"][family] = summarize(family, runs)
    if args.routing:
        raw["routing"] = [routing_compare(args, root, seed) for seed in args.seeds]
        raw["summary"]["routing"] = routing_summary(raw["routing"])
    if "wordchain" in args.families and args.planner_steps:
        raw["planner"] = planner_arm("wordchain", Path(
            raw["runs"]["wordchain"][0]["decomposer"]["run_dir"]), args, root, args.seeds[0])
    lines = [f"{f}: decomposer - generalist {d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"
             for f, r in raw["summary"].items() if (d := r.get("decomposer - generalist"))]
    if lines:
        print("\nsummary: " + "; ".join(lines))
    print(f"runs: {root}")
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
