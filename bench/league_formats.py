"""Exploitability by league format at equal games played, several seeds, 95% intervals.

Each format trains the same fresh ``llama-tiny`` policy (the same warm start, objective and
budget: ``--steps`` steps of ``--games`` games, so every arm plays the same number of games) in
pure self-play (the random baseline only evaluates), then its exact exploitability is read from
the run's last evaluation:

- Kuhn poker (``KuhnPoker-v0``, compact observation): NashConv of the last policy and of the
  format's meta-strategy (PSRO: the Nash mixture; the others: the average of the learner's
  snapshots), at the sampling temperature;
- tic-tac-toe (``TicTacToe-v0``, compact): the exact best-response value against the greedy and
  the sampled policy, averaged over the two seats (0: never loses; 1: always loses).

Formats: ``pfsp`` (against its snapshots), ``mirror`` (latest only), ``fsp`` (fictitious play),
``psro`` (PSRO-Nash), ``league`` (a main agent with a main exploiter and a league exploiter, the
games shared among the three learners). Each (game, format, seed) is its own
``agentrt tournament run`` subprocess with one torch thread; ``--jobs`` run at once. Prints one
row per game and format: mean and 95% interval (Student t over seeds) and the per-seed values;
``--out`` writes the raw rows as JSON.

Run: ``.venv/bin/python bench/league_formats.py [--games-list kuhn,ttt] [--seeds 0 1 2]``
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
FORMATS = ("pfsp", "mirror", "fsp", "psro", "league")
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 9: 2.262}

POLICY = {"model": {"preset": "llama-tiny"}, "micro_batch_size": 256}
GAMES = {
    "kuhn": {
        "env": {"id": "KuhnPoker-v0", "kwargs": {"compact": True},
                "template": {"first": "{observation}\nAction: ", "history": False}},
        "policy": {"rollout": {"sampling": {"temperature": 1.0, "max_new_tokens": 5}},
                   "optim": {"lr": 1.0e-4, "max_grad_norm": 1.0},
                   "algorithm": {"mini_batches": 4, "kl": {"coef": 0.3}}},
        "runner": {"invalid_action": "end", "invalid_penalty": -3.0},
        "warm_start": {"steps": 50, "teacher": "random", "games_per_step": 16, "lr": 1.0e-3},
        "metrics": {"nash_conv": "eval/nash_conv/KuhnPoker-v0",
                    "nash_conv_meta": "eval/nash_conv_mixture/KuhnPoker-v0"},
    },
    "ttt": {
        "env": {"id": "TicTacToe-v0", "kwargs": {"compact": True},
                "template": {"first": "{observation}\nAction: ", "history": False}},
        "policy": {"rollout": {"sampling": {"temperature": 0.7, "max_new_tokens": 3}},
                   "optim": {"lr": 1.0e-4, "max_grad_norm": 1.0, "schedule": "cosine"},
                   "algorithm": {"mini_batches": 4}},
        "runner": {"invalid_action": "end", "invalid_penalty": -2.0},
        "warm_start": {"steps": 150, "teacher": "random", "games_per_step": 16, "lr": 1.0e-3},
        "metrics": {"br_greedy": ("eval/br_value/TicTacToe-v0/seat0/greedy",
                                  "eval/br_value/TicTacToe-v0/seat1/greedy"),
                    "br_sampled": ("eval/br_value/TicTacToe-v0/seat0/sampled",
                                   "eval/br_value/TicTacToe-v0/seat1/sampled"),
                    "win_vs_random": "eval/win_rate_vs_random"},
    },
}


def run_config(game: str, fmt: str, seed: int, steps: int, games: int, run_dir: Path) -> dict:
    spec = GAMES[game]
    policy = {**POLICY, **spec["policy"]}
    if fmt == "league":
        policies = [{**policy, "id": "lm", "league_role": "main"},
                    {**policy, "id": "mx", "league_role": "main_exploiter"},
                    {**policy, "id": "lx", "league_role": "league_exploiter"}]
    else:
        policies = [{**policy, "id": "lm"}]
    return {
        "seed": seed, "run_dir": str(run_dir), "progress": False, "threads": 1,
        "envs": [spec["env"]], "policies": policies,
        "baselines": [{"id": "random", "kind": "random", "seed": 1, "eval_only": True}],
        "schedule": {"format": fmt, "snapshot": {"every": 10, "win_rate": None,
                                                  "min_steps": 5, "max_pool": 20}},
        "runner": spec["runner"], "warm_start": spec["warm_start"],
        "train": {"steps": steps, "games_per_step": games},
        "eval": {"every": steps, "games": 200, "opponents": ["random"], "greedy": True,
                 "exploitability": "auto"},
        "checkpoint": {"every": steps},
    }


def one_arm(game: str, fmt: str, seed: int, steps: int, games: int, tmp: Path) -> dict:
    run_dir = tmp / f"{game}_{fmt}_{seed}"
    path = tmp / f"{game}_{fmt}_{seed}.yaml"
    path.write_text(yaml.safe_dump(run_config(game, fmt, seed, steps, games, run_dir)))
    start = time.perf_counter()
    cli = str(Path(sys.executable).parent / "agentrt")
    proc = subprocess.run([cli, "tournament", "run", str(path)], cwd=ROOT, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{game}/{fmt}/seed {seed} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if any(k.startswith("eval/") for k in r)][-1]
    suffix = "@lm" if fmt == "league" else ""
    out = {"game": game, "format": fmt, "seed": seed, "step": last["step"],
           "games_played": steps * games, "seconds": round(time.perf_counter() - start, 1)}
    for name, key in GAMES[game]["metrics"].items():
        keys = key if isinstance(key, tuple) else (key,)
        values = [last.get(k + suffix) for k in keys]
        out[name] = None if None in values else sum(values) / len(values)
    return out


def interval(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games-list", default="kuhn,ttt")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--games", type=int, default=128)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    arms = [(g, f, s) for g in args.games_list.split(",") for f in args.formats.split(",")
            for s in args.seeds]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda a: one_arm(*a, args.steps, args.games, Path(tmp)), arms))
    print(f"steps {args.steps} x {args.games} games per arm ({args.steps * args.games} games), "
          f"seeds {args.seeds}; mean ± 95% interval (t), then per seed")
    for game in args.games_list.split(","):
        for name in GAMES[game]["metrics"]:
            print(f"\n{game}: {name}")
            for fmt in args.formats.split(","):
                vals = [r[name] for r in rows if r["game"] == game and r["format"] == fmt
                        and r[name] is not None]
                if not vals:
                    print(f"  {fmt:8s} -")
                    continue
                mean, half = interval(vals)
                print(f"  {fmt:8s} {mean:7.3f} ± {half:5.3f}   "
                      + " ".join(f"{v:.3f}" for v in vals))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
