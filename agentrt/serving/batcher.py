"""One thread that batches concurrent requests into generate calls.

Requests are queued as :class:`Job` s; the batcher takes the oldest one and every queued job that
can share its generate call (same weights version, same temperature, top_p and top_k), up to
``max_batch``, and generates them together with the longest ``max_tokens`` of the group; each
response is then cut to its own ``max_tokens`` (a greedy response cut at n tokens is the greedy
response of length n). Work that changes the weights (a hot swap) is queued with :meth:`call`
and runs between two batches, on this thread, so no module changes under a generate call.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from agentrt.config.rollout import SamplingConfig
from agentrt.runtime.rollout.hf import Completion
from agentrt.serving.host import ModelHost, Version
from agentrt.runtime.threads import apply_threads

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    """One prompt to complete.

    Attributes:
        version: The weights it was bound to when admitted (released when it is answered).
        prompt: Token ids.
        sampling: Its sampling settings (its own ``max_new_tokens``).
        on_token: Called on the batcher thread with each new token id (eos included), or None.
        future: Receives the :class:`Completion` (or the exception of its generate call).
    """

    version: Version
    prompt: list[int]
    sampling: SamplingConfig
    on_token: Callable[[int], None] | None = None
    future: Future = field(default_factory=Future)

    def group(self) -> tuple[Any, ...]:
        s = self.sampling
        return (id(self.version), s.temperature, s.top_p, s.top_k)


def cut(completion: Completion, max_new: int) -> Completion:
    """The completion as if generated with ``max_new_tokens = max_new``."""
    if len(completion.response_ids) <= max_new:
        return completion
    return Completion(completion.response_ids[:max_new], completion.logprobs[:max_new], False)


class Batcher:
    """The queue of jobs and the thread that runs them in batches.

    Args:
        host: The weights.
        max_batch: Most prompts in one generate call.
    """

    def __init__(self, host: ModelHost, max_batch: int = 32) -> None:
        self.host, self.max_batch = host, max_batch
        self._cond = threading.Condition()
        self._jobs: deque[Job] = deque()
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="agentrt-batcher", daemon=True)
        self.batches = 0
        self.answered = 0

    def start(self) -> Batcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout=60)

    def submit(self, job: Job) -> Future:
        with self._cond:
            self._jobs.append(job)
            self._cond.notify()
        return job.future

    def call(self, fn: Callable[[], Any]) -> Future:
        """Runs ``fn`` on the batcher thread between two batches; its result in the future."""
        future: Future = Future()
        with self._cond:
            self._calls.append((fn, future))
            self._cond.notify()
        return future

    @property
    def queued(self) -> int:
        return len(self._jobs)

    # ------------------------------------------------------------------ the thread
    def _take(self) -> tuple[list[tuple[Callable[[], Any], Future]], list[Job]]:
        with self._cond:
            while not (self._jobs or self._calls or self._stopping):
                self._cond.wait()
            calls = list(self._calls)
            self._calls.clear()
            batch: list[Job] = []
            if self._jobs and not calls:  # a swap goes first: requests queued after it see it
                key = self._jobs[0].group()
                rest: deque[Job] = deque()
                for job in self._jobs:
                    (batch if job.group() == key and len(batch) < self.max_batch
                     else rest).append(job)
                self._jobs = rest
            return calls, batch

    def _loop(self) -> None:
        apply_threads()  # OpenMP's count is per thread: this one generates
        while True:
            calls, batch = self._take()
            if self._stopping and not calls and not batch:
                return
            for fn, future in calls:
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - the caller gets it
                    future.set_exception(exc)
            if batch:
                self._run(batch)

    def _run(self, batch: list[Job]) -> None:
        version = batch[0].version
        longest = max(j.sampling.max_new_tokens for j in batch)
        sampling = batch[0].sampling.model_copy(update={"max_new_tokens": longest})
        streams = any(j.on_token is not None for j in batch)
        try:
            out = version.module.generate([j.prompt for j in batch], sampling, version.adapter,
                                          self._fan_out(batch) if streams else None)
        except Exception as exc:  # noqa: BLE001 - every job of the batch gets the error
            log.exception("generate failed for %d requests", len(batch))
            for job in batch:
                job.future.set_exception(exc)
        else:
            for job, completion in zip(batch, out):
                job.future.set_result(cut(completion, job.sampling.max_new_tokens))
        finally:
            for job in batch:
                self.host.release(job.version)
            self.batches += 1
            self.answered += len(batch)

    def _fan_out(self, batch: list[Job]) -> Callable[[list[int]], None]:
        """The per-step callback: each row's new token to its job, until eos or its length."""
        eos = batch[0].version.module.tokenizer.eos_token_id
        counts = [0] * len(batch)
        done = [j.on_token is None for j in batch]

        def on_step(tokens: list[int]) -> None:
            for i, tok in enumerate(tokens):
                if done[i]:
                    continue
                counts[i] += 1
                batch[i].on_token(tok)  # type: ignore[misc]
                done[i] = tok == eos or counts[i] >= batch[i].sampling.max_new_tokens

        return on_step
