"""The controller: hosts every policy in a pool and runs the one training loop of every command.

One iteration of :meth:`Controller.run` (DESIGN.md, "Data flow of one iteration")::

    specs   = workload.next_episodes(step)        # 1. prompts, matches, subtask chains ...
    played  = runner.run(specs)                   # 2-3. all episodes at once, batched per policy
    metrics = workload.record(played, step)       # 4. ratings, league, memory writes
    for pid, data in workload.training_data(played):
        metrics |= self.learn(pid, data)          # 5. each learner's objective (RL/preference)
                                                  # 6. weights synced into the rollout in place
    workload.after_step(self, step)               # snapshots, resets
    evaluate / log / checkpoint                   # 7.

A workload is the *scheduler* of a command (``agentrt train``: prompts of a task or data set;
``agentrt tournament run``: matches); what a policy does with its data is its *objective*
(:mod:`agentrt.controller.objectives`). Nothing trains, generates or checkpoints outside this loop.

Pools: LoRA policies on one base share one pool (one base model, one rollout engine; snapshots
are adapters on it); a full-weight policy gets its own. ``runtime.backend`` picks in-process
pools or Ray actors for all of them.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

from agentrt.config.drift import DriftConfig
from agentrt.config.export import ExportConfig
from agentrt.config.rollout import SamplingConfig
from agentrt.config.run import AsyncRolloutConfig
from agentrt.config.sections import GuardsConfig, PolicyConfig, RuntimeConfig, base_key
from agentrt.controller.async_rollout import AsyncRollout
from agentrt.controller.drift import DriftMonitor
from agentrt.controller.episodes import log_step
from agentrt.controller.exporters import Exporters, code_version
from agentrt.controller.guards import RunGuard
from agentrt.controller.objectives import learn
from agentrt.controller.plot import plot_metrics
from agentrt.controller.progress import StepProgress
from agentrt.controller.run_dir import (
    RunDir,
    Timer,
)
from agentrt.controller.state import drift_action, resume, save
from agentrt.controller.versions import VersionBook
from agentrt.controller.workload import Workload
from agentrt.runner.core import EpisodeRunner, EpisodeSpec, RunResult
from agentrt.runtime.allocator import freeze_setup_objects, keep_freed_memory, release_setup_objects
from agentrt.runtime.rollout.hf import Completion
from agentrt.runtime.pool import BasePool, LocalPool
from agentrt.runtime.ray_pool import PolicyPool
from agentrt.runtime.threads import (
    ThreadTuner,
    apply_threads,
    forward_probe,
    spare_cpus,
    threads_auto,
)

log = logging.getLogger(__name__)


def make_pool(policies: PolicyConfig | list[PolicyConfig], runtime: RuntimeConfig,
              seed: int = 0, total_steps: int = 1000, workdir: str | Path | None = None
              ) -> BasePool:
    """A :class:`PolicyPool` when ``runtime.backend`` is 'ray', else a :class:`LocalPool`."""
    if runtime.backend == "ray":
        return PolicyPool(policies, seed=seed, total_steps=total_steps, workdir=workdir,
                          runtime=runtime)
    return LocalPool(policies, seed=seed, total_steps=total_steps, workdir=workdir)


def group_policies(policies: list[PolicyConfig]) -> list[list[PolicyConfig]]:
    """The run's pools: policies grouped by :func:`base_key`, in config order."""
    groups: dict[tuple, list[PolicyConfig]] = {}
    for p in policies:
        groups.setdefault(base_key(p), []).append(p)
    return list(groups.values())


class PolicyHandle:
    """One policy or snapshot in its pool, as an :class:`~agentrt.policies.lm.LMPolicy` drives
    it: ``policy_id``, ``version``, ``tokenizer``, ``cfg`` and ``generate``."""

    def __init__(self, pool: BasePool, key: str, cfg: PolicyConfig) -> None:
        self.pool, self.policy_id, self.cfg = pool, key, cfg
        self.tokenizer = pool.tokenizer

    @property
    def version(self) -> int:
        return self.pool.version_of(self.policy_id)

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig | None = None
                 ) -> list[Completion]:
        return self.pool.generate(prompts, sampling, adapter=self.policy_id)


class Controller:
    """Hosts the run's policies in pools and runs the loop.

    Args:
        policies: Every LM policy of the run (trainable or frozen).
        runtime: In-process pools or Ray actors (``runtime.backend``).
        run_dir: The run folder (config, metrics, checkpoints, plots).
        seed: Seeds the pools (each policy's initialisation) and the workload.
        total_steps: Steps the LR schedules span.
        preference_pairs: Pairs of a ranked list a preference loss uses ("all", "best_worst").
        guards: When the run stops instead of going nowhere (:mod:`agentrt.controller.guards`).
        export: Where each metrics row also goes (Prometheus, MLflow: :mod:`agentrt.controller.exporters`).
        drift: Drift detection on the learners' rollouts and its action (:mod:`agentrt.controller.drift`).
        control: Online control (:class:`agentrt.controller.control.RunControl`): commands applied at the
            start of each step, late-feedback groups added to its training data.
        async_rollout: The next step's rollout during this step's update
            (:mod:`agentrt.controller.async_rollout`); None or off plays each step's episodes in turn.
    """

    def __init__(self, policies: list[PolicyConfig], runtime: RuntimeConfig, run_dir: RunDir,
                 seed: int = 0, total_steps: int = 1000, preference_pairs: str = "all",
                 guards: GuardsConfig | None = None, export: ExportConfig | None = None,
                 drift: DriftConfig | None = None, control: Any | None = None,
                 async_rollout: AsyncRolloutConfig | None = None) -> None:
        self.run_dir = run_dir
        keep_freed_memory(runtime.keep_freed_memory)  # before the pools allocate
        self.prefetch = (AsyncRollout(async_rollout, seed)
                         if async_rollout is not None and async_rollout.enabled else None)
        self.control = control
        self.export = export
        self.exporters = Exporters(None, run_dir.path)
        self.version_book: VersionBook | None = None  # set by run()
        self.last_metrics: dict[str, Any] = {}
        # Finished envs, reset and reused by the next step's runner as within one step: building
        # one (its spaces) took 0.16 ms, 40 ms of each 256-episode step.
        self.env_pool: dict[str, list[Any]] = {}
        self.preference_pairs = preference_pairs
        self.guard = RunGuard(guards or GuardsConfig())
        self.drift = (DriftMonitor(drift, run_dir.path, lambda pid, ids: self.tokenizer(pid)
                                   .decode(ids, skip_special_tokens=True))
                      if drift is not None and drift.enabled else None)
        self.cfgs = {p.id: p for p in policies}
        self.pools: list[BasePool] = []
        try:
            for group in group_policies(list(policies)):
                self.pools.append(make_pool(group, runtime, seed=seed, total_steps=total_steps,
                                            workdir=run_dir.path))
        except BaseException:
            self.shutdown()
            raise
        self._executor = ThreadPoolExecutor(max_workers=max(1, len(self.pools)))
        self.timer = Timer()
        self.step = 0
        self.tuner: ThreadTuner | None = None

    # ------------------------------------------------------------------ routing
    def pool_of(self, key: str) -> BasePool:
        for pool in self.pools:
            if key in pool.versions:
                return pool
        raise KeyError(f"no pool hosts policy or snapshot {key!r}")

    def handle(self, key: str) -> PolicyHandle:
        """The policy (or snapshot ``"<policy>@<tag>"``) ``key`` for an LM policy to drive."""
        cfg = self.cfgs[key.split("@")[0]]
        if "@" in key:
            cfg = cfg.model_copy(update={"trainable": False})
        return PolicyHandle(self.pool_of(key), key, cfg)

    def versions(self) -> dict[str, int]:
        return {k: v for pool in self.pools for k, v in pool.versions.items()}

    def tokenizer(self, pid: str) -> Any:
        return self.pool_of(pid).tokenizer

    def _per_pool(self, work: dict[str, Any], fn: Callable[[BasePool, str, Any], Any]
                  ) -> dict[str, Any]:
        """``fn(pool, policy, item)`` for every item: pools at once, a pool's policies in turn."""
        by_pool: dict[int, list[str]] = {}
        for pid in work:
            by_pool.setdefault(id(self.pool_of(pid)), []).append(pid)

        overlap = self.prefetch is not None and self.prefetch.in_flight  # a rollout thread too
        sharing = len(by_pool) * (2 if overlap else 1)

        def run(pids: list[str]) -> dict[str, Any]:
            apply_threads(sharing)  # OpenMP's count is per thread (agentrt.runtime.threads)
            pool = self.pool_of(pids[0])
            return {p: fn(pool, p, work[p]) for p in pids}

        if len(by_pool) == 1:
            out = run(next(iter(by_pool.values())))
        else:
            out = {}
            for future in [self._executor.submit(run, pids) for pids in by_pool.values()]:
                out |= future.result()
        return {p: out[p] for p in work}

    # ------------------------------------------------------------------ learning
    def learn(self, data: dict[str, Any]) -> dict[str, dict[str, float]]:
        """One step of each policy's objective on its data (pools in parallel)."""
        return self._per_pool(data, lambda pool, pid, d: learn(pool, pid, self.cfgs[pid], d,
                                                               self.preference_pairs))

    def sft_step(self, pid: str, trajectories: list[Any], sft: Any) -> dict[str, float]:
        return self.pool_of(pid).sft_step(trajectories, sft, adapter=pid)

    def end_sft(self, pid: str) -> None:
        self.pool_of(pid).end_sft(adapter=pid)

    def snapshot(self, pid: str, tag: str | int) -> str:
        key = self.pool_of(pid).snapshot(pid, str(tag))
        if self.version_book is not None:
            self.version_book.snapshot(key, pid, self.pool_of(pid).version_of(pid), self.step)
        return key

    def drop_snapshot(self, key: str) -> None:
        self.pool_of(key).drop_snapshot(key)

    def reconfigure(self, cfg: PolicyConfig) -> None:
        """A live change of policy ``cfg.id``'s sampling or learning rate (agentrt.controller.control)."""
        self.cfgs[cfg.id] = cfg
        self.pool_of(cfg.id).reconfigure(cfg)

    def reset_to(self, pid: str, snapshot: str) -> None:
        self.pool_of(pid).reset_to(pid, snapshot)

    def save_pretrained(self, pid: str, folder: Path) -> Path:
        return self.pool_of(pid).save_pretrained(folder, adapter=pid)

    # ------------------------------------------------------------------ the loop
    def play(self, work: Workload, specs: list[EpisodeSpec]) -> RunResult:
        runner = EpisodeRunner(work.players(specs), work.runner, route=work.seat_router(),
                               env_pool=self.env_pool)
        return runner.run(specs, on_episode_end=work.on_episode_end())

    def run(self, work: Workload, stop_after: int | None = None) -> dict[str, float]:
        """Trains to ``work.steps`` (or stops after ``stop_after`` more steps, as if killed);
        resumes from the run folder's last checkpoint. Returns the last metrics row."""
        self.run_dir.write_config(work.config_text())
        # the saved (secret-free) config is what MLflow records
        self.exporters = Exporters(self.export, self.run_dir.path, work.config_text())
        self.version_book = VersionBook(self.run_dir.path,
                                        yaml.safe_load(work.config_text()) or {}, code_version())
        finished = False
        try:
            work.start(self)
            self._tune_threads()
            if self.prefetch is not None:  # its processes start beside the warm start
                self.prefetch.start(self)
            last = {} if resume(self, work) else self._warm_start(work)
            if self.control is not None:
                self.control.start(self)
            bar = StepProgress(work.steps, enabled=work.progress, start=self.step,
                               label=work.label)
            if last:  # a fresh start: show the step-0 evaluation
                bar.update(self.step, last)
            try:
                while self.step < work.steps and not work.done():
                    if stop_after is not None and stop_after <= 0:
                        break
                    last = self._iteration(work, bar)
                    freeze_setup_objects()
                    if stop_after is not None:
                        stop_after -= 1
            except KeyboardInterrupt:
                log.warning("interrupted at step %d; the last checkpoint is resumable", self.step)
                raise
            finally:
                bar.close()
                release_setup_objects()
                plot_metrics(self.run_dir.read_metrics(), self.run_dir.path / "curves.png")
            work.finish(self)
            if self.step >= work.steps or work.done():
                self.exporters.finish()  # registers the final models
            finished = True
        finally:
            if self.control is not None:
                self.control.close()
            self.exporters.close(ok=finished)
        return last

    def _iteration(self, work: Workload, bar: StepProgress) -> dict[str, float]:
        step = self.step + 1
        # Online control: queued commands apply here, at the step boundary, never mid-step.
        events = self.control.step_start(self, step) if self.control is not None else {}
        with self.timer("rollout"):
            if self.prefetch is not None:  # prefetched during the last update, or played now
                played, prefetched = self.prefetch.rollout(self, work, step)
                events |= prefetched
            else:
                specs = work.next_episodes(step)
                played = self.play(work, specs) if specs else RunResult([], [], {})
        if self.tuner is not None:  # after the rollout: no rollout thread computes beside it
            self.tuner.maybe_tune(step)
        metrics = work.record(played, step) | events
        # The episode log: this step's rows replace any a killed run wrote.
        log_step(self.run_dir.path, step, played, self.cfgs, self.tokenizer)
        if self.drift is not None:  # the learners' samples, before they are trained on
            learners = set(self.learners())
            metrics |= self.drift.observe(step, [t for t in played.trajectories
                                                 if t.policy_id in learners])
        self.guard.check_rewards(step, metrics)  # before the failed samples are trained on
        data = work.training_data(played, step)
        if self.control is not None:  # late feedback: the episodes' groups join this step
            data, feedback = self.control.training_data(step, data)
            metrics |= feedback
        if self.prefetch is not None and step < work.steps and step % work.checkpoint_every:
            self.prefetch.launch(self, work, step + 1)  # never across a checkpoint (resume)
        with self.timer("train"):
            learned = self.learn(data)
        for pid, m in learned.items():
            metrics |= m if len(self.learners()) == 1 else {f"{k}@{pid}": v for k, v in m.items()}
        self.guard.check_updates(step, learned)
        self.step = step
        metrics |= work.after_step(self, step)
        if step % work.eval_every == 0 or step == work.steps:
            metrics |= work.evaluate(self)
        metrics |= self.timer.pop() | {"perf/threads": float(torch.get_num_threads())}
        self.run_dir.log_metrics(step, metrics)
        self.exporters.emit(step, metrics)
        self.last_metrics = metrics
        bar.update(step, metrics)
        if self.drift is not None and self.drift.alert is not None:
            drift_action(self, work, self.drift.alert)
        if self.step == step and (step % work.checkpoint_every == 0 or step == work.steps):
            save(self, work)  # (a retrain went back to an earlier step: nothing new to save)
        return metrics


    def _tune_threads(self) -> None:
        """With ``threads`` unset, the fastest thread count for the first in-process policy's
        forward pass (more than one only where spare CPUs allow), checked again every 25 steps
        (:mod:`agentrt.runtime.threads`). Ray workers use ``runtime.resources.cpus_per_worker`` threads
        and are not tuned."""
        local = [p for p in self.pools if isinstance(p, LocalPool)]
        if not threads_auto() or not local:
            return
        engine = local[0].learner
        probe = forward_probe(engine.model, len(local[0].tokenizer))
        self.tuner = ThreadTuner(probe, spare=spare_cpus, watch=lambda: spare_cpus(samples=1))
        self.tuner.tune()

    def learners(self) -> list[str]:
        """Ids of the trainable policies (metrics get an ``@<id>`` suffix when several)."""
        return [pid for pid, cfg in self.cfgs.items() if cfg.trainable]

    def _warm_start(self, work: Workload) -> dict[str, float]:
        """The workload's warm start, the step-0 evaluation and the step-0 checkpoint."""
        self.run_dir.truncate_metrics(-1)  # rows of a start killed before its first checkpoint
        with self.timer("warm_start"):
            metrics = work.warm_start(self)
        metrics |= work.evaluate(self) | self.timer.pop()
        self.run_dir.log_metrics(0, metrics)
        self.exporters.emit(0, metrics)
        self.last_metrics = metrics
        save(self, work)
        return metrics



    def shutdown(self) -> None:
        if self.prefetch is not None:
            self.prefetch.close()
        if hasattr(self, "_executor"):
            self._executor.shutdown(wait=True)
        for pool in self.pools:
            pool.shutdown()
        self.pools = []
        self.run_dir.close()  # the folder's lock


def greedy(sampling: SamplingConfig) -> SamplingConfig:
    return sampling.model_copy(update={"temperature": 0.0})
