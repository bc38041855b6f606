"""The one launch of every run command: ``train``, ``tournament run|eval`` and ``decompose run``.

A run kind brings its config (a :class:`~agentrt.config.run.RunConfig`) and its workload (the
scheduler the loop draws episodes from); everything else is the same for every kind and wired
here once, from the config fields every kind shares: threads, the run folder (identity and lock,
``start``), seeding, the policies' pools, guards, exporters, drift, online control and the
asynchronous rollout. Then :meth:`Run.run` drives :meth:`agentrt.controller.loop.Controller.run`.
"""

from __future__ import annotations

from typing import Any, Callable

from agentrt.config.run import RunConfig
from agentrt.controller.control.run import RunControl
from agentrt.controller.loop import Controller
from agentrt.controller.run_dir import RunDir, seed_everything
from agentrt.controller.workload import Workload
from agentrt.runtime.threads import set_threads


class Run:
    """One run of any kind: its folder, its workload and the controller that drives it.

    Args:
        cfg: The run's validated config.
        workload: Builds the run's workload from ``cfg``. It is built before the run folder is
            opened, so a bad data file or env fails before anything is written.
        start: "auto" resumes only this config's run, "force" resumes the folder's run with this
            config, "new" starts over (:meth:`agentrt.controller.run_dir.RunDir.open`).
    """

    def __init__(self, cfg: RunConfig, workload: Callable[[Any], Workload],
                 start: str = "auto") -> None:
        self.cfg = cfg
        set_threads(cfg.threads)
        self.workload = workload(cfg)
        self.run_dir = RunDir.open(cfg.run_dir, cfg, start, self.workload.outputs)
        seed_everything(cfg.seed)
        # Online control: also without channels, a resume keeps its checkpointed values.
        self.controller = Controller(
            list(self.workload.policies), cfg.runtime, self.run_dir, seed=cfg.seed,
            total_steps=max(1, cfg.train.steps), preference_pairs=self.workload.preference_pairs,
            guards=cfg.guards, export=cfg.export, drift=cfg.drift,
            control=RunControl(cfg.control, self.workload),
            async_rollout=cfg.train.async_rollout)

    def pool_of(self, policy_id: str) -> Any:
        """The pool hosting ``policy_id`` (its weights, versions, tokenizer)."""
        return self.controller.pool_of(policy_id)

    def run(self, stop_after: int | None = None) -> dict[str, float]:
        """Trains to ``train.steps`` (or stops after ``stop_after`` more steps, as if killed);
        resumes from the run folder's last checkpoint. Returns the last metrics row."""
        try:
            return self.controller.run(self.workload, stop_after)
        finally:
            self.workload.close()  # reward pools, models, stores
            self.controller.shutdown()  # Ray: workers killed, Ray stopped if this run started it
