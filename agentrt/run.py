"""The run folder: resolved config, metrics.jsonl, checkpoints, plots.

Layout::

    <run_dir>/config.yaml          the resolved, validated config
    <run_dir>/metrics.jsonl        one JSON object per logged step
    <run_dir>/checkpoints/step_N/  state.pt (+ model files); written to a temp dir, then renamed
    <run_dir>/curves.png           plot of the main metrics
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seeds python, numpy and torch once, explicitly."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


class Timer:
    """Accumulates wall time per phase: ``with timer("rollout"): ...`` -> timing_s/rollout."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[phase] = self.times.get(phase, 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        out = {f"timing_s/{k}": v for k, v in self.times.items()}
        self.times = {}
        return out


class RunDir:
    """One run's output folder."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir = self.path / "checkpoints"
        self.metrics_path = self.path / "metrics.jsonl"

    def write_config(self, text: str) -> None:
        atomic_write_text(self.path / "config.yaml", text)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, "time": time.time(), **{k: _jsonable(v) for k, v in metrics.items()}}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def read_metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.metrics_path)

    def truncate_metrics(self, after_step: int) -> None:
        """Drops rows logged after ``after_step`` (they belong to steps a resume will redo)."""
        truncate_jsonl(self.metrics_path, after_step)

    def save_checkpoint(self, step: int, state: dict[str, Any], keep: int) -> Path:
        """Writes ``checkpoints/step_<step>/state.pt`` atomically and prunes old checkpoints."""
        self.ckpt_dir.mkdir(exist_ok=True)
        final = self.ckpt_dir / f"step_{step}"
        tmp = self.ckpt_dir / f".tmp_step_{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        torch.save(state, tmp / "state.pt")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in self.checkpoints()[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def checkpoints(self) -> list[Path]:
        if not self.ckpt_dir.is_dir():
            return []
        found = [p for p in self.ckpt_dir.glob("step_*") if (p / "state.pt").is_file()]
        return sorted(found, key=lambda p: int(p.name.split("_")[1]))

    def latest_checkpoint(self) -> Path | None:
        ckpts = self.checkpoints()
        return ckpts[-1] if ckpts else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path / "state.pt", weights_only=False)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file ([] if missing); a line cut by a crash mid-write is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def truncate_jsonl(path: Path, after_step: int) -> None:
    """Keeps the rows of ``path`` whose ``"step"`` is at most ``after_step`` (a missing file
    stays missing)."""
    if path.is_file():
        rows = [r for r in read_jsonl(path) if r["step"] <= after_step]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _jsonable(v: Any) -> Any:
    if isinstance(v, (torch.Tensor, np.generic)):
        return v.item()
    return v
