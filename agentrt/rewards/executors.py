"""Reward executors: one interface, ``score_batch(samples) -> (values, errors, metrics)``.

A step's samples are scored in one call per source (:class:`PythonExecutor`,
:class:`~agentrt.rewards.http.HttpExecutor`, :class:`~agentrt.rewards.model.ModelExecutor`);
:class:`WeightedSum` adds several with their weights. A failed sample (the function raised or
timed out, the service gave up, a NaN) has value 0 and an error string: the caller counts it in
``reward/errors`` and never trains on it. Metrics per source: ``reward/<name>/latency_s``,
``reward/<name>/errors`` and, for services, ``reward/<name>/retries`` and ``reward/<name>/down_s``.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import queue
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.pool import Pool, ThreadPool
from typing import TYPE_CHECKING, Any

from agentrt.rewards import checked, resolve_reward

if TYPE_CHECKING:
    from agentrt.rewards.sources import PythonSource, RewardSource

log = logging.getLogger(__name__)
Scores = tuple[list[float], list["str | None"], dict[str, float]]


@dataclass(frozen=True)
class Sample:
    """One response to score.

    Attributes:
        id: Stable id of the sample in its run: ``s<step>-<index>`` (training) or
            ``e<step>-<index>`` (evaluation); a replayed step keeps its ids.
        prompt: The decoded prompt text.
        response: The decoded response text, as the reward function sees it.
        info: The example's info (its answer, data-file columns).
    """

    id: str
    prompt: str
    response: str
    info: dict[str, Any] = field(default_factory=dict)


class RewardExecutor:
    """Scores batches of samples. Subclasses implement :meth:`_score`; this class times it,
    checks the values and names the metrics ``reward/<name>/...``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def score_batch(self, samples: list[Sample]) -> Scores:
        """Scores ``samples``.

        Returns:
            ``(values, errors, metrics)``: one float per sample (0.0 where failed), one error
            string or None per sample, and ``reward/<name>/...`` metrics of this call.
        """
        start = time.perf_counter()
        values, errors, extra = self._score(samples) if samples else ([], [], {})
        for i, value in enumerate(values):
            if errors[i] is None:
                try:
                    values[i] = checked(value)
                except (TypeError, ValueError) as exc:
                    values[i], errors[i] = 0.0, str(exc)
            else:
                values[i] = 0.0
        failed = [e for e in errors if e is not None]
        if failed:
            log.warning("reward source %r: %d of %d samples failed (first: %s)", self.name,
                        len(failed), len(samples), failed[0])
        p = f"reward/{self.name}/"
        metrics = {f"{p}latency_s": time.perf_counter() - start, f"{p}errors": float(len(failed))}
        return values, errors, metrics | {p + k: v for k, v in extra.items()}

    def _score(self, samples: list[Sample]) -> Scores:
        raise NotImplementedError

    def close(self) -> None:
        """Frees pools, connections and models."""


# ----------------------------------------------------------------------------- python functions
def _worker_init(path: list[str], module: str) -> None:
    sys.path[:] = path  # a spawned process finds the parent's modules (examples/, plugins)
    if module and module != "__main__":
        importlib.import_module(module)  # imported before the first call's clock starts


def _ready(_: int) -> int:
    time.sleep(0.05)
    return os.getpid()


def _call(ref: str, module: str, sample: Sample) -> tuple[float | None, str | None]:
    """One reward call in a pool worker; never raises (user exceptions may not pickle)."""
    try:
        if module not in sys.modules and module != "__main__":
            importlib.import_module(module)  # registers the function's name in this process
        return checked(resolve_reward(ref)(sample.prompt, sample.response, dict(sample.info))), None
    except Exception as exc:  # noqa: BLE001 - user code may raise anything
        return None, f"{type(exc).__name__}: {exc}"


class PythonExecutor(RewardExecutor):
    """A reward function: called in this thread (``workers: 1``, no timeout) or from a pool of
    ``workers`` threads or processes, each call limited to ``timeout_s``."""

    def __init__(self, src: PythonSource) -> None:
        super().__init__(src.metric_name)
        self.ref, self.fn = src.python, resolve_reward(src.python)
        self.module = getattr(self.fn, "__module__", "") or ""
        self.workers, self.kind, self.timeout_s = src.workers, src.pool, src.timeout_s
        self._pool: Pool | None = None

    def _score(self, samples: list[Sample]) -> Scores:
        if self.workers == 1 and self.timeout_s is None:
            results = [_call(self.ref, self.module, s) for s in samples]
        else:
            results = self._pooled(samples)
        return [v or 0.0 for v, _ in results], [e for _, e in results], {}

    def _new_pool(self) -> Pool:
        if self.kind == "thread":
            return ThreadPool(self.workers)  # daemon threads: a stuck call never blocks exit
        ctx = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
        pool = ctx.Pool(self.workers, initializer=_worker_init,
                        initargs=(list(sys.path), self.module))
        started: set[int] = set()
        for _ in range(20):  # every worker up (imports done) before a deadline counts
            started |= set(pool.map(_ready, range(2 * self.workers), chunksize=1))
            if len(started) >= self.workers:
                break
        return pool

    def _pooled(self, samples: list[Sample]) -> list[tuple[float | None, str | None]]:
        """At most one call per free worker is in flight, so a call starts when submitted and
        its deadline is submit time + timeout_s. A call past it fails and holds its worker
        until the pool is replaced (at the batch end, or when every worker is stuck)."""
        pool = self._pool = self._pool or self._new_pool()
        done: queue.SimpleQueue = queue.SimpleQueue()  # this batch's results only
        results: list[tuple[float | None, str | None]] = [(None, "not scored")] * len(samples)
        todo, running = deque(range(len(samples))), {}
        free, stuck = self.workers, 0
        while todo or running:
            while todo and free:
                i = todo.popleft()
                pool.apply_async(_call, (self.ref, self.module, samples[i]),
                                 callback=lambda r, i=i: done.put((i, r)),
                                 error_callback=lambda e, i=i: done.put((i, (None, repr(e)))))
                running[i] = time.monotonic() + (self.timeout_s or 1e9)
                free -= 1
            try:
                i, result = done.get(timeout=max(0.0, min(running.values()) - time.monotonic()))
            except queue.Empty:
                now = time.monotonic()
                for i in [i for i, deadline in running.items() if deadline <= now]:
                    results[i] = (None, f"timed out after {self.timeout_s:g} s")
                    del running[i]
                    stuck += 1
                if stuck == self.workers:  # nothing can run: a fresh pool
                    pool = self._replace_pool()
                    free, stuck = self.workers, 0
                continue
            if i in running:  # else a late answer of a call that already timed out
                del running[i]
                free += 1
                results[i] = result
        if stuck:
            self._replace_pool()
        return results

    def _replace_pool(self) -> Pool:
        if self._pool is not None:
            self._pool.terminate()  # kills stuck processes; stuck threads are left behind
        self._pool = self._new_pool()
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None


# ----------------------------------------------------------------------------- combination
class WeightedSum(RewardExecutor):
    """``sum(weight_i * value_i)`` over sources, each scored on the whole batch (concurrently:
    a service's wait overlaps a model's forward). A sample failed in any source is failed."""

    def __init__(self, parts: list[tuple[RewardExecutor, float]]) -> None:
        super().__init__("sum")
        self.parts = parts

    def score_batch(self, samples: list[Sample]) -> Scores:
        if len(self.parts) == 1:
            scored = [self.parts[0][0].score_batch(samples)]
        else:
            with ThreadPoolExecutor(len(self.parts)) as ex:
                scored = list(ex.map(lambda p: p[0].score_batch(samples), self.parts))
        values, errors, metrics = [0.0] * len(samples), [None] * len(samples), {}
        for (_, weight), (vals, errs, m) in zip(self.parts, scored):
            metrics |= m
            for i, (v, e) in enumerate(zip(vals, errs)):
                values[i] += weight * v
                errors[i] = errors[i] or e
        values = [0.0 if e else v for v, e in zip(values, errors)]
        return values, errors, metrics

    def close(self) -> None:
        for executor, _ in self.parts:
            executor.close()


def build_executor(sources: list[RewardSource], device: str = "cpu", namespace: str = ""
                   ) -> WeightedSum:
    """The executor of a run's ``reward:`` sources (see :func:`~agentrt.rewards.sources.sources_of`).

    Args:
        sources: The sources, each with its weight.
        device: Where a reward model runs (the policy's device).
        namespace: Prefix of HTTP idempotency keys, unique per run and policy, so that one
            service shared by several runs never mixes their samples.
    """
    built: list[tuple[RewardExecutor, float]] = []
    try:
        for src in sources:
            built.append((src.build(device=device, namespace=namespace), src.weight))
    except BaseException:
        for executor, _ in built:
            executor.close()
        raise
    return WeightedSum(built)
