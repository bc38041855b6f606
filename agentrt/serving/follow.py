"""``agentrt serve RUN_DIR --follow``: serve a run that is still training.

The run writes each learning policy in Hugging Face format into every checkpoint
(``checkpoint.models: true``: ``checkpoints/step_N/models/<id>/``). The follower serves the
newest one at start and, whenever a newer checkpoint appears, tries it through the canary path
(:mod:`agentrt.serving.canary`): it answers a share of the requests, and the sequential test
promotes it (hot swap) or rolls it back. One canary per policy at a time; when it decides, the
newest checkpoint not yet tried is next (checkpoints written meanwhile are skipped, not queued).

What it serves is copied first into ``RUN_DIR/serve_follow/<id>/step_N/`` (the run prunes its
old checkpoints, and a restarted server must find its versions again), and its state is
``RUN_DIR/serve_follow/follow.json``, rewritten whole (temporary file, then rename) at every
poll and every decision: the version each name serves, the last step tried, and each running
canary's :meth:`~agentrt.serving.canary.CanaryRun.snapshot`. A restarted ``serve --follow``
serves the same versions and goes on with the same canaries where they were (rewards counted up
to the last poll).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from agentrt.controller.checkpoint import MANIFEST, MODELS
from agentrt.controller.run_dir import STEP_FOLDER
from agentrt.core.errors import AgentrtError
from agentrt.serving.api import Api
from agentrt.serving.canary import CanaryConfig, CanaryRun
from agentrt.serving.protocol import RequestError
from agentrt.serving.sources import Source, is_adapter, is_model, source_of

log = logging.getLogger(__name__)

FOLDER = "serve_follow"
STATE = "follow.json"


def newest_models(run_dir: Path) -> dict[str, tuple[int, Path]]:
    """Policy id -> (step, folder) of the newest checkpoint holding ``models/<id>/`` (one with
    its manifest: written whole)."""
    found: dict[str, tuple[int, Path]] = {}
    ckpts = run_dir / "checkpoints"
    steps = sorted(((int(m[1]), p) for p in (ckpts.iterdir() if ckpts.is_dir() else [])
                    if (m := STEP_FOLDER.fullmatch(p.name))), reverse=True)
    for step, folder in steps:
        try:
            if not (folder / MANIFEST).is_file():
                continue
            for model in (folder / MODELS).iterdir():
                found.setdefault(model.name, (step, model))
        except OSError:  # pruned while we looked
            continue
    return found


def check_followable(run_dir: Path) -> None:
    """Raises AgentrtError unless ``run_dir`` is a run folder whose config writes models."""
    try:
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise AgentrtError(f"--follow needs a run folder (its config.yaml): {exc}") from None
    if not (cfg.get("checkpoint") or {}).get("models"):
        raise AgentrtError(f"--follow: the run in {run_dir} writes no models into its "
                           "checkpoints; set checkpoint.models: true in its config")


class Follower:
    """Serves a training run's newest checkpoints through canaries (module docstring).

    Args:
        run_dir: The run folder.
        canary: Settings of each canary (``CanaryConfig`` fields but ``model`` and ``path``).
        poll_s: How often the checkpoints are looked at and the state saved.
    """

    def __init__(self, run_dir: Path, canary: dict[str, Any], poll_s: float = 1.0) -> None:
        if is_model(run_dir) or is_adapter(run_dir):
            raise AgentrtError(f"--follow takes a run folder (its config.yaml), not the model "
                               f"folder {run_dir}")
        self.run_dir, self.canary, self.poll_s = run_dir, dict(canary), poll_s
        self.folder = run_dir / FOLDER
        self.state: dict[str, Any] = {"current": {}, "tried": {}, "canaries": {}}
        if (self.folder / STATE).is_file():
            self.state.update(json.loads((self.folder / STATE).read_text()))
        self.api: Api | None = None

    # ------------------------------------------------------------------ start
    def sources(self, wait_s: float = 600.0) -> list[Source]:
        """What to serve at start: each name's saved version, else its newest checkpoint
        (waiting up to ``wait_s`` for the run's first)."""
        deadline = time.monotonic() + wait_s
        while True:
            if (self.run_dir / "config.yaml").is_file():  # else: the run has not started yet
                check_followable(self.run_dir)
            for name, (step, path) in newest_models(self.run_dir).items():
                if name not in self.state["current"] and (copy := self._copy(name, step, path)):
                    self.state["current"][name] = {"step": step, "path": str(copy)}
                    self.state["tried"][name] = step
            current = {n: c for n, c in self.state["current"].items() if Path(c["path"]).is_dir()}
            if current:
                self.state["current"] = current
                self._save()
                return [source_of(n, Path(c["path"]), None) for n, c in sorted(current.items())]
            if time.monotonic() > deadline:
                raise AgentrtError(f"--follow: no run wrote a checkpoint with models into "
                                   f"{self.run_dir} in {wait_s:.0f} s")
            time.sleep(self.poll_s)

    def attach(self, api: Api) -> None:
        self.api = api
        api.on_decided = self.decided

    async def run(self) -> None:
        """The background task: resume saved canaries, then poll until cancelled."""
        await self._resume()
        while True:
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - the server goes on serving what it has
                log.exception("--follow: a poll failed")
            await asyncio.sleep(self.poll_s)

    async def _resume(self) -> None:
        assert self.api is not None
        for name, saved in list(self.state["canaries"].items()):
            cfg = CanaryConfig.model_validate(saved["snapshot"]["cfg"])
            try:
                await self.api.start_canary(cfg, resume=saved["snapshot"])
                log.info("%s: canary of step %d resumed", name, saved["step"])
            except RequestError as exc:
                log.warning("%s: saved canary of step %d not resumed: %s", name, saved["step"],
                            exc)
                del self.state["canaries"][name]

    # ------------------------------------------------------------------ each poll
    async def tick(self) -> None:
        """Saves the running canaries' state; starts a canary for each newer checkpoint."""
        assert self.api is not None
        for name, (step, path) in newest_models(self.run_dir).items():
            if (name not in self.api.host.current or step <= self.state["tried"].get(name, -1)
                    or name in self.api.canaries):
                continue
            copy = self._copy(name, step, path)
            if copy is None:
                continue
            self.state["tried"][name] = step
            cfg = CanaryConfig.model_validate({"seed": step, **self.canary, "model": name,
                                               "path": str(copy)})
            try:
                await self.api.start_canary(cfg)
            except RequestError as exc:
                log.warning("%s: step %d not tried: %s", name, step, exc)
                shutil.rmtree(copy, ignore_errors=True)
                continue
            self.state["canaries"][name] = {"step": step, "snapshot": None}
            log.info("%s: trying step %d on %.0f%% of requests", name, step,
                     100 * cfg.share)
        self._save()

    def decided(self, run: CanaryRun) -> None:
        """A canary decided: a promoted step is the name's version now; a rolled-back one's
        copy goes."""
        name = run.cfg.model
        step = self.state["canaries"].pop(name, {}).get("step")
        old = self.state["current"].get(name)
        if run.state == "promoted" and step is not None:
            self.state["current"][name] = {"step": step, "path": run.cfg.path}
            if old and old["path"] != run.cfg.path:
                shutil.rmtree(old["path"], ignore_errors=True)  # loaded: the files can go
        else:
            shutil.rmtree(run.cfg.path, ignore_errors=True)
        log.info("%s: step %s %s", name, step, run.state)
        self._save()

    # ------------------------------------------------------------------ files
    def _copy(self, name: str, step: int, src: Path) -> Path | None:
        """``src`` copied to ``serve_follow/<name>/step_<step>/``; None if the run pruned it
        meanwhile."""
        dst = self.folder / name / f"step_{step}"
        if dst.is_dir():
            return dst
        tmp = dst.with_name(f".tmp_{dst.name}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            shutil.copytree(src, tmp)
        except (OSError, shutil.Error) as exc:
            log.info("%s: step %d was pruned before it was copied (%s)", name, step, exc)
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        os.replace(tmp, dst)
        return dst

    def _save(self) -> None:
        if self.api is not None:
            for name, saved in self.state["canaries"].items():
                run = self.api.canaries.get(name)
                if run is not None and run.running:
                    saved["snapshot"] = run.snapshot()
        self.state["canaries"] = {n: c for n, c in self.state["canaries"].items()
                                  if c["snapshot"] is not None}
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{STATE}.tmp"
        tmp.write_text(json.dumps(self.state, indent=1))
        os.replace(tmp, self.folder / STATE)
