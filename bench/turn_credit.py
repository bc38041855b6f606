"""Turn-level credit on tic-tac-toe: the `make demo` recipe with each advantage and opponent
variant, several seeds, exact exploitability at equal games played.

Every arm is `examples/ttt_league.yaml` (the same fresh llama-tiny, warm start, league, budget)
with one change:

- ``rae``: the example as it is (RAE: one baseline per env, seat and opponent line);
- ``rae_per_state``: ``algorithm.rae_per_state: true`` (a baseline per prompt as well: each
  turn's return against the mean return from that same state);
- ``ppo``: ``algorithm.name: ppo`` (a critic over turns, GAE with gamma = lambda = 1);
- ``best_response``: a ``kind: best_response`` baseline in the pool (the exact best response to
  the learner's greedy play, recomputed every 5 steps);
- ``kl``: ``algorithm.kl.coef: 0.1`` (to the warm-started policy: keeps the entropy up).

Read from the run's last evaluation: greedy blunders (states the greedy policy can be led to
where its move gives game value away; 0 is unexploitable), the exact best-response value
(greedy), the greedy win rate against random and the loss rate against minimax, each averaged
over the two seats. Each (variant, seed) is its own ``agentrt tournament run`` subprocess with one
torch thread; ``--jobs`` at once. Prints mean ± 95% interval (t over seeds) and per-seed values;
``--out`` writes the raw rows as JSON.

Run: ``.venv/bin/python bench/turn_credit.py [--steps 150] [--seeds 1 2 3]``
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exploitability import interval, last_eval  # noqa: E402  (a sibling bench script)

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("rae", "rae_per_state", "ppo", "best_response", "kl")
ENV = "TicTacToe-v0"
METRICS = {"blunders": f"eval/blunders/{ENV}/seat{{s}}",
           "br_greedy": f"eval/br_value/{ENV}/seat{{s}}/greedy",
           "win_vs_random": "eval/win_rate_seat{s}_vs_random",
           "loss_vs_minimax": "eval/loss_rate_seat{s}_vs_minimax"}


def run_config(variant: str, seed: int, steps: int, run_dir: Path) -> dict:
    cfg = yaml.safe_load((ROOT / "examples" / "ttt_league.yaml").read_text())
    cfg = copy.deepcopy(cfg) | {"seed": seed, "run_dir": str(run_dir), "progress": False,
                                "threads": 1}
    cfg["train"]["steps"] = steps
    cfg["eval"]["every"] = steps
    cfg["checkpoint"] = {"every": steps}
    algo = cfg["policies"][0]["algorithm"]
    if variant == "rae_per_state":
        algo["rae_per_state"] = True
    elif variant == "ppo":
        algo["name"] = "ppo"
    elif variant == "kl":
        algo["kl"] = {"coef": 0.1}
    elif variant == "best_response":
        cfg["baselines"].append({"id": "br", "kind": "best_response", "target": "lm",
                                 "every": 5, "seed": 3})
    return cfg


def one_arm(variant: str, seed: int, steps: int, tmp: Path) -> dict:
    cfg = run_config(variant, seed, steps, tmp / f"{variant}_{seed}")
    last, seconds = last_eval(cfg, f"{variant}_{seed}", tmp)
    out = {"variant": variant, "seed": seed, "step": last["step"], "seconds": seconds}
    for name, key in METRICS.items():
        out[name] = sum(last[key.format(s=s)] for s in (0, 1)) / 2
        out |= {f"{name}/seat{s}": last[key.format(s=s)] for s in (0, 1)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    variants = args.variants.split(",")
    arms = [(v, s) for v in variants for s in args.seeds]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda a: one_arm(*a, args.steps, Path(tmp)), arms))
    print(f"tic-tac-toe, make demo's recipe, {args.steps} steps x 128 games per arm, seeds "
          f"{args.seeds}; seat-averaged; mean ± 95% interval (t), then per seed")
    for name in METRICS:
        print(f"\n{name}")
        for v in variants:
            vals = [r[name] for r in rows if r["variant"] == v]
            mean, half = interval(vals)
            print(f"  {v:14s} {mean:7.3f} ± {half:6.3f}   " + " ".join(f"{x:.3f}" for x in vals))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
