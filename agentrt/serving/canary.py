"""A canary in ``agentrt serve``: a candidate version answers a share of a served name's requests,
its responses' rewards are compared with the current version's by the sequential test of
:mod:`agentrt.serving.canary_stats`, and it is promoted (it becomes the current version through the hot-swap
path) or rolled back (unloaded). Every look of the test is a JSON line in the canary log.

Which arm answers a request is drawn from ``random.Random(seed)`` in the order requests are
admitted, so a given sequence of requests is routed the same way on every run. A reward reaches
the test by ``POST /v1/feedback {"id": completion id, "reward": x}`` or from a scorer (a reward
function ``(prompt, response, info) -> float``, agentrt.rewards) applied to every response.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import Field

from agentrt.serving.canary_stats import Arm, CanaryTest, Decision, SequentialTest
from agentrt.rewards import RewardFn
from agentrt.serving.host import Version
from agentrt.core.schema import MAX_SEED


class CanaryConfig(CanaryTest):
    """``POST /admin/canary``'s body: the test's settings and what to try where."""

    model: str = Field(description="The served name whose requests are shared.")
    path: str = Field(description="The candidate: a model or adapter folder, as /admin/load.")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seed of the routing draws.")
    scorer: str | None = Field(None, description="Reward function scoring every response "
                               "(a registered name or module:function); null: feedback only.")


class CanaryLog:
    """Appends one JSON object per line to ``path`` (created with its folder when missing)."""

    def __init__(self, path: Path) -> None:
        self.path, self._lock = path, threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"time": round(time.time(), 3), **record}) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(line)
                f.flush()


class CanaryRun:
    """One canary of one served name, from start to its decision.

    Args:
        cfg: Its settings.
        scorer: The reward function applied to every response (``cfg.scorer``), or None.
        incumbent: The name's current version when it started.
        candidate: The candidate version (loaded, held by the host until promoted or withdrawn).
        log: Where its events go.
    """

    def __init__(self, cfg: CanaryConfig, scorer: RewardFn | None, incumbent: Version,
                 candidate: Version, log: CanaryLog, resume: dict[str, Any] | None = None
                 ) -> None:
        self.cfg, self.scorer, self.log = cfg, scorer, log
        self.incumbent, self.candidate = incumbent, candidate
        self.test = SequentialTest(CanaryTest(**cfg.model_dump(
            include=set(CanaryTest.model_fields))))
        self._rng = random.Random(cfg.seed)
        self._lock = threading.Lock()
        self.routed = {"candidate": 0, "incumbent": 0}
        self.served: dict[str, Arm] = {}  # completion id -> arm, until its reward arrives
        self.state = "running"  # then promoted | rolled back
        self.events: list[dict[str, Any]] = []
        if resume is not None:
            self._restore(resume)
            self._event("resume", path=cfg.path, samples=self.test.samples,
                        looks_done=len(self.test.decisions), routed=dict(self.routed))
            return
        d = self.test.design
        self._event("start", path=cfg.path, share=cfg.share, alpha=cfg.alpha, power=cfg.power,
                    margin=cfg.margin, looks=cfg.looks, low=cfg.low, high=cfg.high,
                    sigma=self.test.test.planning_sigma, seed=cfg.seed, scorer=cfg.scorer,
                    fixed_samples=round(d.fixed_samples, 2), inflation=round(d.inflation, 4),
                    max_samples=d.max_samples, at_samples=list(d.at_samples),
                    promote_at=[round(x, 4) for x in d.promote_at],
                    rollback_at=[round(x, 4) for x in d.rollback_at])

    def _event(self, kind: str, **fields: Any) -> None:
        record = {"event": kind, "model": self.cfg.model,
                  "candidate": self.candidate.fingerprint,
                  "incumbent": self.incumbent.fingerprint, **fields}
        self.events.append(record)
        self.log.write(record)

    @property
    def running(self) -> bool:
        return self.state == "running"

    def route(self) -> Arm:
        """The arm of the next admitted request."""
        with self._lock:
            arm: Arm = "candidate" if self._rng.random() < self.cfg.share else "incumbent"
            self.routed[arm] += 1
            return arm

    def answered(self, rid: str, arm: Arm) -> None:
        """A response ``rid`` of ``arm`` was sent: its reward may come later."""
        with self._lock:
            self.served[rid] = arm

    def reward(self, rid: str, value: float, via: str) -> Decision | None:
        """Counts the reward of response ``rid``; the test's Decision when it was a look.

        Raises:
            KeyError: ``rid`` is no response of this canary waiting for a reward.
            ValueError: the value is out of [low, high] (nothing counted).
        """
        with self._lock:
            if not self.running:
                raise KeyError(rid)
            arm = self.served[rid]
            decision = self.test.add(arm, value)  # ValueError before anything changes
            del self.served[rid]
            if decision is not None:
                self._event("look", via=via, **decision.record())
                if decision.decision != "continue":
                    self.state = "deciding"
            return decision

    def finish(self, decision: Decision, version: Version | None) -> None:
        """Records what was done on a final decision: ``version`` is the name's current one."""
        self.state = "promoted" if decision.decision == "promote" else "rolled back"
        self.served.clear()
        self._event(self.state.replace(" ", "_"), now_serving=version.fingerprint
                    if version else None, samples=decision.samples,
                    routed=dict(self.routed), rule=decision.rule)

    def snapshot(self) -> dict[str, Any]:
        """What a restarted server needs to go on with this canary (JSON-able): its settings,
        each arm's running statistics, the looks made, the routing counts and RNG, and the
        responses still waiting for a reward."""
        with self._lock:
            version, internal, gauss = self._rng.getstate()
            return {"cfg": self.cfg.model_dump(),
                    "arms": {a: [s.n, s.mean, s.m2] for a, s in self.test.arms.items()},
                    "decisions": [asdict(d) for d in self.test.decisions],
                    "routed": dict(self.routed), "served": dict(self.served),
                    "rng": [version, list(internal), gauss]}

    def _restore(self, saved: dict[str, Any]) -> None:
        for arm, (n, mean, m2) in saved["arms"].items():
            stats = self.test.arms[arm]
            stats.n, stats.mean, stats.m2 = int(n), float(mean), float(m2)
        self.test.decisions = [Decision(**d) for d in saved["decisions"]]
        self.routed = {k: int(v) for k, v in saved["routed"].items()}
        self.served = dict(saved["served"])
        version, internal, gauss = saved["rng"]
        self._rng.setstate((version, tuple(internal), gauss))

    def status(self) -> dict[str, Any]:
        t = self.test
        return {"model": self.cfg.model, "state": self.state, "path": self.cfg.path,
                "candidate": self.candidate.fingerprint, "incumbent": self.incumbent.fingerprint,
                "routed": dict(self.routed),
                "samples": {a: s.n for a, s in t.arms.items()},
                "mean": {a: s.mean for a, s in t.arms.items()},
                "max_samples": t.design.max_samples, "next_look_at": next(
                    (n for n in t.design.at_samples[len(t.decisions):]), None),
                "events": self.events}
