"""Asynchronous rollout with bounded staleness (``train.async_rollout``, docs/async.md).

A part of the controller loop, not a second loop. With it on, step t of
:meth:`agentrt.controller.loop.Controller._iteration` runs::

    played = async_rollout.rollout(t)     # step t's episodes, generated during step t-1's update
                                          # (played now on the first step and after a checkpoint)
    record, training data                 # rewards scored here, in the loop's thread, in order
    async_rollout.launch(t + 1)           # draws step t+1's prompts, syncs the copy to the
                                          # current weights (version v), starts playing them
    learn(data)                           # the update (v -> v+1) runs meanwhile

The copy (:class:`~agentrt.runtime.pool.RolloutCopy`) is a second module in shared memory, synced in
place before each launch and generating in a process of its own (the runner's thread here waits
for it), so with one update per step every prefetched sample is one version behind when trained.
Each sample keeps the version that generated it (``Turn.policy_version``); the pool marks a batch
with older samples stale and the PPO ratio then uses their rollout (behaviour) log-probs. A step
whose samples are more than ``max_staleness`` versions behind (or ahead: weights reloaded) is
played again by the live policy with the same prompts (``async/dropped_stale``).

No checkpoint holds a rollout in flight: the step a checkpoint is saved at launches none, so the
next step plays synchronously in the uninterrupted run and in a resumed one alike (a resume is
exact, and a prompt is neither lost nor trained twice). A run killed with a rollout in flight
resumes from its last checkpoint, whose prompt position comes before those prompts.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agentrt.config.rollout import SamplingConfig
from agentrt.config.run import AsyncRolloutConfig
from agentrt.config.sections import PolicyConfig
from agentrt.runtime.rollout.hf import Completion
from agentrt.core.errors import ConfigError
from agentrt.runtime.pool import LocalPool, RolloutCopy
from agentrt.runner.core import EpisodeRunner, EpisodeSpec, RunResult
from agentrt.runtime.threads import apply_threads


class CopyHandle:
    """A policy as its rollout copy serves it (an :class:`~agentrt.policies.lm.LMPolicy`
    engine): turns record the copy's version."""

    def __init__(self, copy: RolloutCopy, cfg: PolicyConfig, tokenizer: Any) -> None:
        self.copy, self.cfg, self.tokenizer = copy, cfg, tokenizer
        self.policy_id = copy.name

    @property
    def version(self) -> int:
        return self.copy.version

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig | None = None
                 ) -> list[Completion]:
        return self.copy.generate(prompts, sampling or self.cfg.rollout.sampling)


@dataclass
class _InFlight:
    step: int
    specs: list[EpisodeSpec]
    future: Future


class AsyncRollout:
    """The next step's rollout beside this step's update: episodes in a thread of their own,
    generation in the learners' rollout copies (a process each, :class:`RolloutCopy`).

    Args:
        cfg: ``train.async_rollout``.
        seed: The run's seed; the copies' random stream of step t is seeded from it and t.
    """

    def __init__(self, cfg: AsyncRolloutConfig, seed: int) -> None:
        self.cfg, self.seed = cfg, seed
        self.copies: dict[str, RolloutCopy] = {}
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrt-rollout")
        self._flight: _InFlight | None = None
        self._starting: list[Future] = []  # the copies' process starts (their errors)

    @property
    def in_flight(self) -> bool:
        return self._flight is not None

    def start(self, ctl: Any) -> None:
        """Copies the learners' modules (now, while nothing trains) and starts their rollout
        processes in the rollout thread, beside the warm start and the first steps."""
        for pid in ctl.learners():
            pool = ctl.pool_of(pid)
            if not isinstance(pool, LocalPool):
                raise ConfigError("train.async_rollout needs runtime.backend: local")
            self.copies[pid] = pool.rollout_copy(pid)
            self._starting.append(self._thread.submit(self.copies[pid].start))

    def launch(self, ctl: Any, work: Any, step: int) -> None:
        """Draws step ``step``'s episodes and starts playing them on the copies, synced to the
        learners' current weights, while the caller goes on (to the update)."""
        specs = work.next_episodes(step)
        players = dict(work.players(specs))
        for pid in [p for p in players if p in self.copies]:
            copy = self.copies[pid]
            copy.sync()
            copy.reseed(self.seed * 1_000_003 + step)
            players[pid] = players[pid].on(CopyHandle(copy, ctl.cfgs[pid], ctl.tokenizer(pid)))
        runner = EpisodeRunner(players, work.runner, route=work.seat_router())
        future = self._thread.submit(self._play, runner, specs, work.on_episode_end())
        self._flight = _InFlight(step, specs, future)

    def rollout(self, ctl: Any, work: Any, step: int) -> tuple[RunResult, dict[str, float]]:
        """Step ``step``'s episodes: the ones in flight when within ``max_staleness``, else
        (nothing in flight, or too stale) played now by the live policy."""
        flight, self._flight = self._flight, None
        metrics = {"async/dropped_stale": 0.0, "async/overlap_s": 0.0}
        if flight is None:
            specs = work.next_episodes(step)
        else:
            assert flight.step == step, f"rollout of step {flight.step} taken at step {step}"
            start = time.perf_counter()
            played, seconds = flight.future.result()
            waited = time.perf_counter() - start
            apply_threads()  # the loop's thread computes alone again
            behind = [ctl.pool_of(t.policy_id).version_of(t.policy_id) - t.policy_version
                      for t in played.trajectories if t.policy_id in self.copies]
            metrics |= {"async/rollout_s": seconds, "async/overlap_s": max(0.0, seconds - waited)}
            if all(0 <= b <= self.cfg.max_staleness for b in behind):
                return played, metrics | {
                    "rollout/staleness": sum(behind) / len(behind) if behind else 0.0}
            metrics["async/dropped_stale"] = float(len(behind))
            specs = flight.specs  # the same prompts, generated again
        played = ctl.play(work, specs) if specs else RunResult([], [], {})
        return played, metrics | {"rollout/staleness": 0.0}

    def _play(self, runner: EpisodeRunner, specs: list[EpisodeSpec], on_end: Any
              ) -> tuple[RunResult, float]:
        """The rollout thread's work: the envs and the runner here, the generation in the
        copies' processes (this thread waits for them without the GIL)."""
        for started in self._starting:  # after them in this thread: raises what failed
            started.result()
        start = time.perf_counter()
        played = runner.run(specs, on_episode_end=on_end) if specs else RunResult([], [], {})
        return played, time.perf_counter() - start

    def close(self) -> None:
        """Waits for a rollout in flight (a run stopped after its step), ends the thread and
        the copies' processes."""
        self._thread.shutdown(wait=True)
        self._flight = None
        for copy in self.copies.values():
            copy.close()

