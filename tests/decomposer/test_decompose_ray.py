"""The decomposer on ``runtime.backend: ray`` is the same run as in-process: the controller
loop is one, only the transport of the policy pools changes (docs/runtime.md).

The same word-chain run (rule planner, an LM specialist trained by GRPO, Python tools, epsilon
routing, repairs) on Ray actors and in this process plays the same chains and ends at the same
weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrt.config.load import validate_config
from agentrt.decomposer.config import DecomposeConfig
from agentrt.decomposer.workload import Decomposer
from agentrt.controller.run_dir import RunDir
from test_decompose_run import model_of, not_timing, read_jsonl, tool_config


@pytest.mark.slow
def test_decompose_run_on_ray_plays_the_chains_of_the_local_run(ray_session, tmp_path,
                                                                 tiny_model_dir) -> None:
    out = {}
    for backend in ("ray", "local"):
        run_dir = tmp_path / backend
        cfg = tool_config(run_dir, tiny_model_dir, steps=2,
                          **{"runtime.backend": backend, "runtime.num_cpus": 2})
        Decomposer(validate_config(cfg, DecomposeConfig)).run()
        rows = [not_timing(r) for r in RunDir(run_dir).read_metrics()]
        chains = read_jsonl(run_dir / "chains.jsonl")
        out[backend] = (chains, rows, model_of(RunDir(run_dir).checkpoints()[-1], "reader"))
    (ray_chains, ray_rows, ray_w), (local_chains, local_rows, local_w) = out["ray"], out["local"]
    assert len(local_chains) == 2 * 8 and ray_chains == local_chains
    assert any("runtime/worker_restarts" in r for r in ray_rows)  # a Ray actor pool
    assert not any("runtime/worker_restarts" in r for r in local_rows)
    assert [r.get("decompose/success") for r in ray_rows] == \
        [r.get("decompose/success") for r in local_rows]
    worst = max(float((ray_w[k] - local_w[k]).abs().max()) for k in local_w)
    assert worst < 1e-5, worst
