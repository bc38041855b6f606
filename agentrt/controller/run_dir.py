"""The run folder: resolved config, metrics.jsonl, checkpoints, plots.

Layout::

    <run_dir>/config.yaml          the resolved, validated config
    <run_dir>/run.json             the run's identity (agentrt.controller.identity)
    <run_dir>/.lock                held (flock) by the process writing the folder
    <run_dir>/metrics.jsonl        one JSON object per logged step
    <run_dir>/checkpoints/step_N/  state.pt + manifest.json (agentrt.controller.checkpoint); written to a
                                   temp dir, then renamed
    <run_dir>/curves.png           plot of the main metrics

:meth:`RunDir.open` starts or resumes a run in a folder: it takes the lock, then checks that the
folder holds this run (or none), or starts over (``start="new"``) by deleting what a run wrote.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Collection, Iterator

import numpy as np
import torch
from pydantic import BaseModel

from agentrt.controller.checkpoint import CheckpointError, load_checkpoint, write_checkpoint
from agentrt.controller.identity import (IDENTITY, RunFolderError, added, at_default, differences, lock,
                              read_identity, run_identity, unlock)
from agentrt.core.seeding import numpy_state, random_state, set_numpy_state, set_random_state

__all__ = ["RunDir", "Timer", "load_checkpoint", "seed_everything", "rng_state", "set_rng_state",
           "read_jsonl", "truncate_jsonl", "atomic_write_text"]
STEP_FOLDER = re.compile(r"step_(\d+)")
START = ("auto", "force", "new")
log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seeds python, numpy and torch once, explicitly."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's python, numpy and torch RNG states as plain data and a tensor."""
    return {"python": random_state(), "numpy": numpy_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    set_random_state(state["python"])
    set_numpy_state(state["numpy"])
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

    #: What every run writes here (glob patterns) besides its checkpoints; a workload adds its
    #: own. ``--new-run`` deletes these and the checkpoint folders, nothing else.
    outputs = ("config.yaml", IDENTITY, "metrics.jsonl", "curves.png", "base_model_*", ".*.tmp",
               "drift.jsonl")

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise RunFolderError(f"run_dir {self.path} is a file, not a folder; give a folder "
                                 "(it is created if missing)")
        self.path.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir = self.path / "checkpoints"
        self.metrics_path = self.path / "metrics.jsonl"
        self.start = "auto"  # how open() was asked to take the folder ("force": accept damage)

    @classmethod
    def open(cls, path: str | Path, config: BaseModel, start: str = "auto",
             outputs: tuple[str, ...] = ()) -> RunDir:
        """The run folder of a run of ``config`` (a resolved config), locked for this process
        until :meth:`close`.

        Args:
            start: "auto" resumes the run the folder holds only if it is this config's;
                "force" resumes it whatever config it had (this config's identity replaces it);
                "new" deletes what the folder's run wrote (``outputs`` too) and starts over.
            outputs: Glob patterns of the files the command writes besides :attr:`outputs`.

        Raises:
            RunFolderError: another process writes the folder, or it holds another run and
                ``start`` is "auto".
        """
        if start not in START:
            raise ValueError(f"start must be one of {START}, not {start!r}")
        run = cls(path)
        run.start = start
        lock(run.path)
        try:
            run._claim(run_identity(config.model_dump(mode="json")), at_default(config), start,
                       cls.outputs + tuple(outputs))
        except BaseException:
            run.close()
            raise
        return run

    def _claim(self, identity: dict[str, Any], defaulted: set[str], start: str,
               outputs: tuple[str, ...]) -> None:
        held = None if start == "new" else read_identity(self.path, strict=start == "auto")
        identity["run_uid"] = self._run_uid(held if start != "new" else read_identity(self.path))
        if (self.path / IDENTITY).is_dir() and start == "force":
            raise RunFolderError(f"{self.path / IDENTITY} is a directory; remove it or pass "
                                 "--new-run to start over")
        if start == "new":
            removed = self.remove(outputs)
            if removed:
                log.warning("--new-run: deleted the previous run's %s in %s",
                            ", ".join(removed), self.path)
        elif held is not None and held["config_sha256"] != identity["config_sha256"]:
            new_fields = added(held, identity, defaulted)
            diff = differences(held, identity, ignore=new_fields)
            if not diff:  # made by an agentrt without these fields: it ran as their defaults do
                log.warning("run folder %s was made before config field(s) %s existed; resuming "
                            "it with their defaults", self.path, ", ".join(sorted(new_fields)))
            elif start == "auto" and not self.checkpoints():  # nothing of it to resume
                removed = self.remove(outputs)
                log.warning("run folder %s holds a run of another config that saved no "
                            "checkpoint (%s); starting this one over in it%s", self.path, diff,
                            f" (deleted its {', '.join(removed)})" if removed else "")
            elif start == "auto":
                raise RunFolderError(
                    f"run folder {self.path} holds another run ({diff}); pass --new-run to "
                    "start over in it or --resume force to continue it with this config")
            else:
                log.warning("--resume force: continuing the run in %s with this config (%s)",
                            self.path, diff)
        elif held is None and self.checkpoints():
            log.warning("run folder %s records no run identity (%s); it takes this config's",
                        self.path, IDENTITY)
        atomic_write_text(self.path / IDENTITY, json.dumps(identity, indent=1) + "\n")

    @staticmethod
    def _run_uid(held: dict[str, Any] | None) -> str:
        """What tells this folder's run from every other in a shared service (its records in
        a Redis memory bank): kept across resumes and --new-run (which then deletes what the
        folder's earlier run wrote there), new for a folder without a run. A folder made
        before run_uid existed keeps the key its run used, its config hash's first 16 digits."""
        if held is None:
            return uuid.uuid4().hex[:16]
        return str(held.get("run_uid") or held["config_sha256"][:16])

    def remove(self, patterns: tuple[str, ...]) -> list[str]:
        """Deletes the checkpoints and the entries of this folder matching ``patterns`` (a
        user's own files, in ``checkpoints/`` too, stay); returns what it deleted."""
        found = sorted({p for pattern in patterns for p in self.path.glob(pattern)})
        ckpts = self.checkpoints() + sorted(self.ckpt_dir.glob(".tmp_step_*"))
        for p in found + ckpts:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        if self.ckpt_dir.is_dir() and not any(self.ckpt_dir.iterdir()):
            self.ckpt_dir.rmdir()
        return [p.name for p in found] + [f"checkpoints/{p.name}" for p in ckpts]

    def close(self) -> None:
        """Releases the folder's lock (the end of the process does too)."""
        unlock(self.path)

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

    def save_checkpoint(self, step: int, state: dict[str, Any], keep: int,
                        pinned: Collection[int] = (),
                        extra: Callable[[Path], None] | None = None) -> Path:
        """Writes ``checkpoints/step_<step>/`` (``extra(folder)`` first, e.g. the policies'
        model folders, then state.pt, then its manifest) into a temporary folder renamed into
        place, and prunes old checkpoints (``keep`` newest stay, and those of the ``pinned``
        steps: a drift rollback's target)."""
        self.ckpt_dir.mkdir(exist_ok=True)
        final = self.ckpt_dir / f"step_{step}"
        tmp = self.ckpt_dir / f".tmp_step_{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        if extra is not None:
            extra(tmp)
        write_checkpoint(tmp, step, state)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in self.checkpoints()[:-keep]:
            if int(old.name.removeprefix("step_")) not in pinned:
                shutil.rmtree(old, ignore_errors=True)
        return final

    def checkpoints(self) -> list[Path]:
        """Checkpoint folders ``step_<N>``, oldest first; other names (``step_10.bak``,
        ``notes``, the temporary ``.tmp_step_N``) are not checkpoints and are left alone."""
        if not self.ckpt_dir.is_dir():
            return []
        found = {int(m[1]): p for p in self.ckpt_dir.iterdir()
                 if (m := STEP_FOLDER.fullmatch(p.name)) and p.is_dir()}
        return [found[k] for k in sorted(found)]

    def load_latest(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that verifies (None: no checkpoint); each newer damaged one is
        one warning line naming it and why.

        Raises:
            CheckpointError: there are checkpoints and none verifies.
        """
        damaged: list[tuple[Path, CheckpointError]] = []
        for path in reversed(self.checkpoints()):
            try:
                state = load_checkpoint(path)
            except CheckpointError as exc:
                damaged.append((path, exc))
                continue
            for bad, why in damaged:
                log.warning("checkpoint %s is damaged (%s); resuming from %s instead", bad, why,
                            path.name)
            return path, state
        if damaged:
            whys = "; ".join(f"{bad.name}: {why}" for bad, why in damaged)
            raise CheckpointError(f"{self.ckpt_dir} holds no good checkpoint ({whys}); pass "
                                  "--new-run to start the run over")
        return None


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


def count_jsonl(path: Path, through_step: int) -> int:
    """Rows of ``path`` whose ``"step"`` is at most ``through_step`` (0 for a missing file)."""
    return sum(1 for r in read_jsonl(path)
               if isinstance(r, dict) and isinstance(r.get("step"), int)
               and r["step"] <= through_step)


def truncate_jsonl(path: Path, after_step: int) -> None:
    """Keeps the rows of ``path`` whose ``"step"`` is at most ``after_step`` (a missing file
    stays missing)."""
    if path.is_file():
        rows = [r for r in read_jsonl(path) if r["step"] <= after_step]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def atomic_write_text(path: Path, text: str) -> None:
    """Replaces ``path`` with ``text`` at once; a file that already holds it is left untouched
    (a resume that fails later must not have changed the folder)."""
    if path.is_file() and path.read_bytes() == text.encode():
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _jsonable(v: Any) -> Any:
    if isinstance(v, (torch.Tensor, np.generic)):
        return v.item()
    return v
