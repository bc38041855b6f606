"""A run's saved state: what a checkpoint of the controller loop holds, its save, the resume
from the newest good checkpoint, and the drift monitor's rollback to an earlier one.

Functions of the :class:`~agentrt.controller.loop.Controller` they save and restore; the loop
calls them at its step boundaries.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrt.controller.drift import DriftPaused, weights_sha256
from agentrt.controller.identity import RunFolderError
from agentrt.controller.checkpoint import MODELS, load_checkpoint
from agentrt.controller.episodes import EPISODES, EpisodeLog
from agentrt.controller.versions import VERSIONS, read_versions
from agentrt.controller.run_dir import count_jsonl, rng_state, set_rng_state, truncate_jsonl
from agentrt.controller.workload import Workload

if TYPE_CHECKING:
    from agentrt.controller.loop import Controller

log = logging.getLogger(__name__)


def stored_rows(ctl: Controller, work: Workload, step: int, verify: bool = False
                ) -> dict[str, int]:
    """Rows of steps <= ``step`` in each store of the run folder: the metrics, the episode log
    and the workload's own (a league's matches), read without changing anything (``verify``:
    the episode log's integrity checked too, on resume)."""
    rows = count_jsonl(ctl.run_dir.metrics_path, step)
    # versions: the policy records (a version's record is rewritten, with a later step, at a
    # later checkpoint that finds the policy still at that version; records only get added)
    versions = sum(1 for r in read_versions(ctl.run_dir.path).values() if isinstance(r, dict)
                   and r.get("kind") == "policy")
    episodes = EpisodeLog(ctl.run_dir.path).count_through(step, verify)
    return {"metrics.jsonl": rows, EPISODES: episodes, VERSIONS: versions,
            **work.stored_rows(step)}


#: Stores whose rows through a step may grow after its checkpoint (versions.json gets the
#: checkpoint's own records right after it): fewer rows than recorded is the loss.
GROWING = (VERSIONS,)


def check_stores(ctl: Controller, work: Workload, ckpt: Any, state: dict[str, Any]) -> None:
    """The stores hold the rows ``ckpt`` recorded through its step (before a resume changes
    anything): a store deleted, cut or replaced since would resume silently wrong. Refused
    with one line; ``--resume force`` goes on with a warning."""
    recorded = state.get("stores")
    if not recorded:  # a checkpoint of an agentrt before the counts
        return
    found = stored_rows(ctl, work, int(state["step"]), verify=True)  # damaged: one line
    lost = [f"{name} holds {found[name]} of the {want} rows {ckpt.name} recorded"
            for name, want in recorded.items() if name in found and (
                found[name] < want if name in GROWING else found[name] != want)]
    if not lost:
        return
    what = "; ".join(lost)
    if ctl.run_dir.start == "force":
        log.warning("%s (deleted, cut or replaced since); --resume force: going on with them as "
                    "they are", what)
        return
    raise RunFolderError(f"{what}: rows were lost or changed since the checkpoint; restore "
                         f"the file(s), or pass --resume force to go on with them as they are")


def state_dict(ctl: Controller, work: Workload) -> dict[str, Any]:
    """What a checkpoint holds: the step, every pool, the workload, RNG, drift, control, and
    the rows each store holds through the step (checked on resume)."""
    state = {"step": ctl.step, "pools": {p.cfg.id: p.state_dict() for p in ctl.pools},
             "workload": work.state_dict(), "rng": rng_state(),
             "stores": stored_rows(ctl, work, ctl.step)}
    if ctl.drift is not None:
        state["drift"] = ctl.drift.state_dict()
    if ctl.control is not None:
        state["control"] = ctl.control.state_dict()
    return state


def save(ctl: Controller, work: Workload) -> None:
    """Writes the checkpoint of ``ctl.step`` (checked first: never one with NaN weights)."""
    if ctl.prefetch is not None and ctl.prefetch.in_flight:
        raise RuntimeError("a checkpoint with a rollout in flight would skip its prompts")
    if ctl.drift is not None:
        ctl.drift.saved(ctl.step)
    state = state_dict(ctl, work)
    ctl.guard.check_state(ctl.step, state)  # never a checkpoint with NaN weights
    def models(folder: Path) -> None:  # servable folders, inside the checkpoint
        for pid in ctl.learners():
            ctl.save_pretrained(pid, folder / MODELS / pid)

    ctl.run_dir.save_checkpoint(ctl.step, state, work.checkpoint_keep,
                                 pinned=ctl.drift.pinned() if ctl.drift else (),
                                 extra=models if work.checkpoint_models else None)
    ctl.guard.saved(ctl.step)
    kept = ctl.run_dir.checkpoints()  # a damaged newer one falls back to any of these
    oldest = int(kept[0].name.removeprefix("step_")) if kept else ctl.step
    work.checkpointed(ctl.step, oldest)  # e.g. a Redis stream acknowledges what they all hold
    if ctl.version_book is not None:  # after the checkpoint: a record names a saved version
        ctl.version_book.checkpointed(ctl.step, {p: ctl.pool_of(p).version_of(p)
                                               for p in ctl.learners()}, ctl.last_metrics)


def resume(ctl: Controller, work: Workload) -> bool:
    """Restores the newest good checkpoint of the run folder; False when there is none."""
    found = ctl.run_dir.load_latest()  # a damaged newest one: a warning, the one before
    if found is None:
        return False
    ckpt, state = found
    check_stores(ctl, work, ckpt, state)
    ctl.step = int(state["step"])
    set_rng_state(state["rng"])  # first: the pools' own RNG states (they sampled) win
    for pool in ctl.pools:
        if pool.cfg.id not in state["pools"]:
            raise RunFolderError(f"{ckpt} holds no policy {pool.cfg.id!r} (it holds "
                                 f"{', '.join(state['pools'])}); {_CHECK_IT}")
        try:
            pool.load_state_dict(state["pools"][pool.cfg.id])  # also syncs the rollouts
        except Exception as exc:  # noqa: BLE001 - a Ray actor wraps the torch error
            mismatch = _size_mismatch(str(exc))
            if mismatch is None:
                raise
            raise RunFolderError(f"{ckpt} does not fit policy {pool.cfg.id!r} of this "
                                 f"config ({mismatch}); {_CHECK_IT}") from None
    work.load_state_dict(state["workload"])
    if ctl.control is not None:  # its live values: the workload and policy take them
        ctl.control.load_state_dict(ctl, state.get("control"))
    ctl.run_dir.truncate_metrics(ctl.step)
    if ctl.drift is not None:
        truncate_jsonl(ctl.drift.events, ctl.step)
        ctl.drift.load_state_dict(state.get("drift"), ctl.step)
    ctl.guard.saved(ctl.step)
    log.warning("resumed from %s (step %d)", ckpt, ctl.step)
    return True


def drift_action(ctl: Controller, work: Workload, alert: dict[str, Any]) -> None:
    """The drift alert's action (:mod:`agentrt.controller.drift`): pause saves and stops; rollback
    and retrain load the last good checkpoint's policies and workload state (this process's
    RNG goes on: fresh samples), retrain also its step."""
    assert ctl.drift is not None
    if alert["action"] == "log":
        return
    if alert["action"] == "pause":
        message = ctl.drift.pause_message(alert, ctl.step)
        save(ctl, work)
        raise DriftPaused(message)
    good = alert["rollback_to"]
    ckpt = ctl.run_dir.ckpt_dir / f"step_{good}"
    state = load_checkpoint(ckpt)
    before = fingerprints(ctl)
    for pool in ctl.pools:
        pool.load_state_dict({**state["pools"][pool.cfg.id], "rng": None})
    work.load_state_dict(state["workload"])
    event = {"event": alert["action"], "step": ctl.step, "checkpoint_step": good,
             "checkpoint": str(ckpt.relative_to(ctl.run_dir.path)),
             "weights_before": before, "weights_after": fingerprints(ctl)}
    if alert["action"] == "retrain":
        ctl.step = good
        ctl.run_dir.truncate_metrics(good)
    ctl.drift.acted(event)
    log.warning("drift: %s to %s (step %d); the run goes on from step %d", alert["action"],
                event["checkpoint"], good, ctl.step)


def fingerprints(ctl: Controller) -> dict[str, str]:
    """sha256 of each learner's trainable weights (drift events name what was loaded)."""
    return {pid: weights_sha256(ctl.pool_of(pid).weights(pid)) for pid in ctl.learners()}


_CHECK_IT = ("`agentrt ckpt check RUN_DIR --against CONFIG` names every difference; pass "
             "--new-run to start over")


def _size_mismatch(message: str) -> str | None:
    """The first 'size mismatch for <weight>: ...' of a torch load error, shortened."""
    for line in message.splitlines():
        line = line.strip()
        if line.startswith("size mismatch for "):
            return line.replace("copying a param with shape torch.Size(", "").replace(
                ") from checkpoint, the shape in current model is torch.Size(", " in the "
                "checkpoint, ").rstrip(".").removesuffix(")") + " in this config"
    return None
