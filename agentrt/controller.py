"""The driver-side controller: one object that runs a run's calls over any number of pools.

Calls to different pools run at once (one driver thread per pool; each thread only submits Ray
calls and waits, so the GIL is not the limit); the policies of one pool (LoRA adapters on one
base) take their turn inside that pool. A single-policy run is this with one pool.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from agentrt.config import PolicyConfig, RuntimeConfig, SamplingConfig
from agentrt.engine import Completion
from agentrt.pool import BasePool, LocalPool, PolicyPool
from agentrt.types import Trajectory


def make_pool(policies: PolicyConfig | list[PolicyConfig], runtime: RuntimeConfig,
              seed: int = 0, total_steps: int = 1000, workdir: str | Path | None = None
              ) -> BasePool:
    """A :class:`PolicyPool` when ``runtime.backend`` is 'ray', else a :class:`LocalPool`."""
    if runtime.backend == "ray":
        return PolicyPool(policies, seed=seed, total_steps=total_steps, workdir=workdir,
                          runtime=runtime)
    return LocalPool(policies, seed=seed, total_steps=total_steps, workdir=workdir)


class Controller:
    """Routes per-policy work to the pools that host the policies, pools in parallel.

    Args:
        pools: The run's pools; every policy (and snapshot) id must be hosted by one of them.
    """

    def __init__(self, pools: list[BasePool]) -> None:
        self.pools = list(pools)
        self._executor = ThreadPoolExecutor(max_workers=max(1, len(self.pools)))

    def pool_of(self, policy: str) -> BasePool:
        for pool in self.pools:
            if policy in pool.versions:
                return pool
        raise KeyError(f"no pool hosts policy {policy!r}")

    def _per_pool(self, work: dict[str, Any], fn: Callable[[BasePool, str, Any], Any]
                  ) -> dict[str, Any]:
        """``fn(pool, policy, item)`` for every item; pools at once, a pool's policies in turn."""
        by_pool: dict[int, list[str]] = {}
        for policy in work:
            by_pool.setdefault(id(self.pool_of(policy)), []).append(policy)

        def run(policies: list[str]) -> dict[str, Any]:
            pool = self.pool_of(policies[0])
            return {p: fn(pool, p, work[p]) for p in policies}

        futures = [self._executor.submit(run, policies) for policies in by_pool.values()]
        out: dict[str, Any] = {}
        for future in futures:
            out |= future.result()
        return {p: out[p] for p in work}

    def generate(self, prompts: dict[str, list[list[int]]],
                 sampling: SamplingConfig | None = None) -> dict[str, list[Completion]]:
        """Completions per policy (or snapshot) id."""
        return self._per_pool(prompts, lambda pool, p, x: pool.generate(x, sampling, adapter=p))

    def train(self, batches: dict[str, list[Trajectory]]) -> dict[str, dict[str, float]]:
        """One RL step for every policy in ``batches``; metrics per policy id."""
        return self._per_pool(batches, lambda pool, p, x: pool.train(x, adapter=p))

    @staticmethod
    def flatten(results: dict[str, dict[str, float]]) -> dict[str, float]:
        """``{policy: {key: v}}`` -> ``{"policy/<id>/<key>": v}``: one metrics row per step."""
        return {f"policy/{p}/{k}": v for p, metrics in results.items() for k, v in metrics.items()}

    def state_dict(self) -> list[dict[str, Any]]:
        return [pool.state_dict() for pool in self.pools]

    def load_state_dict(self, states: list[dict[str, Any]]) -> None:
        for pool, state in zip(self.pools, states):
            pool.load_state_dict(state)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)
        for pool in self.pools:
            pool.shutdown()
