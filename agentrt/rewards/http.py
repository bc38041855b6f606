"""The HTTP reward executor: a user's reward service scores batches of samples.

The contract (docs/rewards.md; ``examples/reward_server.py`` implements it)::

    POST <url>   {"samples": [{"id": "s3-5", "key": "<run>:s3-5:<digest>", "prompt": "12+30=",
                               "response": "42", "info": {"answer": "42"}}, ...]}
    200          {"rewards": [1.0, ...]}          one number (or null: that sample failed) each

``key`` is an idempotency key: the run, the sample id and a digest of prompt and response. A
request is retried when it cannot connect, times out or gets 429/5xx (exponential backoff with
full jitter, up to ``retries``); a service that honours the key answers a retried batch it
already scored from what it stored, so no sample is scored twice. After the last retry the
batch's samples are failed: the step's failed share then decides, through
``guards.max_reward_error_rate``, whether the run stops (its last checkpoint resumable) or goes
on without them; a failed sample is never trained on.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import random
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from agentrt.core.urls import redact
from agentrt.rewards.executors import RewardExecutor, Sample, Scores

if TYPE_CHECKING:
    from agentrt.rewards.sources import HttpSource

log = logging.getLogger(__name__)
_RETRYABLE = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError,
              socket.timeout, OSError)


class HttpExecutor(RewardExecutor):
    """POSTs ``batch_size`` samples per request, ``max_concurrency`` requests at once."""

    def __init__(self, src: HttpSource, namespace: str = "") -> None:
        super().__init__(src.metric_name)
        self.src, self.namespace = src, namespace
        token = os.environ.get(src.token_env, "") if src.token_env else ""
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def key(self, sample: Sample) -> str:
        """The idempotency key: a replayed step with the same texts has the same key."""
        digest = hashlib.sha256(f"{sample.prompt}\0{sample.response}".encode()).hexdigest()[:16]
        return f"{self.namespace}:{sample.id}:{digest}"

    def _score(self, samples: list[Sample]) -> Scores:
        n = self.src.batch_size
        batches = [samples[i:i + n] for i in range(0, len(samples), n)]
        with ThreadPoolExecutor(min(self.src.max_concurrency, len(batches))) as ex:
            done = list(ex.map(self._batch, batches))
        values = [v for d in done for v in d[0]]
        errors = [e for d in done for e in d[1]]
        outages = sorted(d[3] for d in done if d[3] is not None)
        extra = {"retries": float(sum(d[2] for d in done)), "down_s": _union(outages),
                 "unavailable": float(any(d[4] for d in done))}
        return values, errors, extra

    def _batch(self, batch: list[Sample]
               ) -> tuple[list[float], list[str | None], int, tuple[float, float] | None, bool]:
        """(values, errors, retries, outage (start, end) or None, gave up on an outage)."""
        body = json.dumps({"samples": [
            {"id": s.id, "key": self.key(s), "prompt": s.prompt, "response": s.response,
             "info": s.info} for s in batch]}, default=str).encode()
        first_fail: float | None = None
        for attempt in range(self.src.retries + 1):
            try:
                answer = self._post(body)
            except _RETRYABLE as exc:
                reason = _reason(exc)
                first_fail = first_fail or time.monotonic()
                if attempt < self.src.retries:
                    delay = min(self.src.max_backoff_s, self.src.backoff_s * 2 ** attempt)
                    time.sleep(random.uniform(0.0, delay))  # full jitter: clients spread out
                continue
            except _Refused as exc:  # 4xx or a malformed answer: retrying cannot help
                return [0.0] * len(batch), [str(exc)] * len(batch), attempt, _span(first_fail), \
                    False
            values, errors = _parse(answer, len(batch))
            return values, errors, attempt, _span(first_fail), False
        why = (f"{redact(self.src.http)} did not answer after {self.src.retries + 1} tries over "
               f"{time.monotonic() - (first_fail or time.monotonic()):.1f} s ({reason})")
        log.warning("reward source %r: %s; %d samples failed", self.name, why, len(batch))
        return [0.0] * len(batch), [why] * len(batch), self.src.retries, _span(first_fail), True

    def _post(self, body: bytes) -> Any:
        request = urllib.request.Request(self.src.http, data=body, headers=self.headers,
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.src.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 429 or exc.code >= 500:
                raise ConnectionError(f"HTTP {exc.code}") from None
            detail = exc.read()[:200].decode("utf-8", "replace")
            raise _Refused(f"{redact(self.src.http)} answered HTTP {exc.code}: {detail}") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise _Refused(f"{redact(self.src.http)} answered something that is not JSON") from None


class _Refused(Exception):
    """The service answered, but not with rewards: retrying the same request cannot help."""


def _parse(answer: Any, n: int) -> tuple[list[float], list[str | None]]:
    rewards = answer.get("rewards") if isinstance(answer, dict) else None
    if not isinstance(rewards, list) or len(rewards) != n:
        why = f"the service's answer has no 'rewards' list of {n} numbers"
        return [0.0] * n, [why] * n
    reasons = answer.get("errors") if isinstance(answer.get("errors"), list) else []
    values: list[float] = []
    errors: list[str | None] = []
    for i, r in enumerate(rewards):
        ok = isinstance(r, (int, float)) and not isinstance(r, bool)
        values.append(float(r) if ok else 0.0)
        why = reasons[i] if i < len(reasons) and reasons[i] else "the service marked it failed"
        errors.append(None if ok else str(why))
    return values, errors


def _span(first_fail: float | None) -> tuple[float, float] | None:
    return None if first_fail is None else (first_fail, time.monotonic())


def _union(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by the (sorted) spans: the outage as the run saw it."""
    total, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def _reason(exc: BaseException) -> str:
    inner = getattr(exc, "reason", None)
    if isinstance(inner, BaseException):
        exc = inner
    return (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).lower()
