"""Checkpoint size after 30 league steps: snapshots capped (``schedule.snapshot.max_pool``, 20 by
default) against kept without limit (``max_pool: null``, the default before issue 18).

    .venv/bin/python bench/checkpoint_size.py                       # llama-nano, 30 steps
    .venv/bin/python bench/checkpoint_size.py --preset llama-tiny --steps 40 --caps 20 10 null

Every arm runs the same league (TicTacToe-v0 vs random, a snapshot every step so the pool fills
fast) through ``agentrt tournament run`` in a subprocess, side by side in one invocation, and
prints the size of the last checkpoint folder and how many snapshots it holds. Every snapshot's
weights are saved in every checkpoint, so without a cap a checkpoint grows with the run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml


def league(run_dir: Path, preset: str, steps: int, cap: int | None) -> dict:
    return {
        "seed": 0, "run_dir": str(run_dir), "progress": False, "threads": 1,
        "envs": [{"id": "TicTacToe-v0", "template": {"history": False}}],
        "policies": [{"id": "lm", "model": {"preset": preset},
                      "rollout": {"sampling": {"max_new_tokens": 3}}}],
        "baselines": [{"id": "random", "kind": "random", "seed": 1}],
        "schedule": {"format": "pfsp", "snapshot": {"every": 1, "win_rate": None,
                                                    "min_steps": 1, "max_pool": cap}},
        "train": {"steps": steps, "games_per_step": 4},
        "eval": {"every": 1000, "games": 2},
        "checkpoint": {"every": steps, "keep": 1},
    }


def measure(folder: Path, preset: str, steps: int, cap: int | None) -> tuple[int, int]:
    """(bytes of the last checkpoint folder, snapshots it holds) of one arm."""
    cfg = folder / "league.yaml"
    cfg.write_text(yaml.safe_dump(league(folder / "run", preset, steps, cap)))
    out = subprocess.run([sys.executable, "-m", "agentrt.cli", "tournament", "run", str(cfg)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"arm max_pool={cap} failed:\n{(out.stdout + out.stderr)[-3000:]}")
    ckpt = folder / "run" / "checkpoints" / f"step_{steps}"
    size = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    state = torch.load(ckpt / "state.pt", weights_only=True, map_location="cpu")
    snaps = sum(len(pool.get("snapshots", {})) for pool in state["pools"].values())
    return size, snaps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-nano")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--caps", nargs="+", default=["20", "null"],
                        help="max_pool of each arm (null: no cap)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ckpt-size-") as tmp:
        for text in args.caps:
            cap = None if text == "null" else int(text)
            folder = Path(tmp) / f"cap-{text}"
            folder.mkdir()
            rows.append((text, *measure(folder, args.preset, args.steps, cap)))
    print(f"{args.preset}, {args.steps} league steps, a snapshot every step")
    print(f"{'max_pool':>9}{'snapshots':>11}{'checkpoint MB':>15}")
    for text, size, snaps in rows:
        print(f"{text:>9}{snaps:>11}{size / 1e6:>15.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
