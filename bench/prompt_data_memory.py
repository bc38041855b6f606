"""Resident memory of a prompt data set streamed from Parquet (issue 14, must-show 1).

Writes the 100,000-row file of examples/make_prompts_parquet.py and reads it through the
``dataset`` prompt source (column mapping, an extra column for the reward, 1% held out), noting
the process's resident memory (RSS) after 10,000 and after 100,000 rows drawn: it must stay
within 10%. Side by side in the same run, what reading the whole file into a Python list (the
preference loader's way) adds.

``--train`` reads the rows through real GRPO steps of the nano model instead (``agentrt train``'s
workload: the source, episodes, the reward reading the extra column, updates, checkpoints), and
notes RSS when the run has drawn 10,000 and 100,000 rows.

    python bench/prompt_data_memory.py            # the source alone, a few seconds
    python bench/prompt_data_memory.py --train    # through training (minutes on a CPU)
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from make_prompts_parquet import write  # noqa: E402

COLUMNS = {"prompt": "question", "answer": "target", "extra": ["tolerance", "difficulty"]}
MARKS = (10_000, 100_000)


def rss_mib() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


class Marks:
    """RSS when the rows drawn first reach each mark."""

    def __init__(self) -> None:
        self.drawn = 0
        self.rss: dict[int, float] = {}

    def add(self, n: int) -> None:
        self.drawn += n
        for mark in MARKS:
            if mark not in self.rss and self.drawn >= mark:
                self.rss[mark] = rss_mib()


def task(path: Path) -> dict[str, Any]:
    return {"name": "dataset", "eval_size": 128,
            "options": {"path": str(path), "columns": COLUMNS, "eval": {"fraction": 0.01}}}


def through_source(path: Path, batch: int) -> Marks:
    from agentrt.workloads.prompts.config import TaskConfig
    from agentrt.workloads.prompts.data import open_source

    source = open_source(TaskConfig(**task(path)), seed=0)
    source.start(None)
    marks = Marks()
    while marks.drawn < MARKS[-1]:
        examples = source.next(batch)
        assert all("tolerance" in ex.info for ex in examples)
        marks.add(len(examples))
    return marks


def through_training(path: Path, folder: Path, per_step: int) -> Marks:
    from agentrt.config.load import validate_config
    from agentrt.workloads.prompts.config import TrainConfig
    from agentrt.workloads.prompts.workload import Trainer

    steps = -(-MARKS[-1] // per_step)
    cfg = validate_config({
        "seed": 0, "run_dir": str(folder / "run"), "progress": False, "task": task(path),
        "reward": "prompt_rewards:within_tolerance",
        "policy": {"model": {"preset": "llama-nano"}, "micro_batch_size": per_step,
                   "rollout": {"sampling": {"max_new_tokens": 2}, "batch_size": per_step}},
        "train": {"steps": steps, "prompts_per_step": per_step, "group_size": 1},
        "eval": {"every": 10 * steps}, "checkpoint": {"every": 10, "keep": 1}}, TrainConfig)
    trainer = Trainer(cfg)
    marks, source = Marks(), trainer.workload.source
    real = source.next

    def counted(n: int) -> Any:
        out = real(n)
        marks.add(len(out))
        return out

    source.next = counted
    trainer.run()
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", action="store_true", help="read through GRPO steps")
    parser.add_argument("--per-step", type=int, default=1000, help="prompts per step (--train)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = write(folder / "prompts.parquet", MARKS[-1])
        print(f"file: {MARKS[-1]:,} rows, {path.stat().st_size / 2**20:.1f} MiB parquet")
        marks = (through_training(path, folder, args.per_step) if args.train
                 else through_source(path, 256))
        low, high = (marks.rss[m] for m in MARKS)
        how = "GRPO steps" if args.train else "the dataset source"
        print(f"through {how}: RSS after {MARKS[0]:,} rows {low:.1f} MiB, after "
              f"{MARKS[1]:,} rows {high:.1f} MiB, ratio {high / low:.3f} "
              f"({'within' if abs(high / low - 1) <= 0.10 else 'NOT within'} 10%)")
        import pyarrow.parquet as pq

        before = rss_mib()
        rows = pq.read_table(path).to_pylist()
        print(f"side by side: the whole file as a list of {len(rows):,} rows adds "
              f"{rss_mib() - before:.1f} MiB")


if __name__ == "__main__":
    main()
