"""Many policies in one run: four LoRA adapters over one base in a Ray pool, next to a
full-weight policy in its own pool, driven by one controller; frozen snapshots."""

from __future__ import annotations

import pytest
import torch

from agentrt.algos.config import AlgorithmConfig
from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import ModelConfig, PolicyConfig, RuntimeConfig
from agentrt.controller.loop import Controller
from agentrt.runtime.pool import LocalPool
from agentrt.controller.run_dir import RunDir
from agentrt.core.types import Trajectory, Turn

ALGOS = {"p0": "grpo", "p1": "rloo", "p2": "reinforce++", "p3": "grpo"}


def lora_policy(model_dir, pid: str, algo: str, lr: float) -> PolicyConfig:
    return PolicyConfig(id=pid, model=ModelConfig(path=str(model_dir)), lora={"enabled": True},
                        algorithm=AlgorithmConfig(name=algo), optim={"lr": lr},
                        rollout={"sampling": SamplingConfig(max_new_tokens=4)},
                        resources={"num_workers": 1, "cpus_per_worker": 1})


def trajectories(pid: str, prompts: list[list[int]], comps, step: int) -> list[Trajectory]:
    """Each policy gets its own reward, so the policies must learn different things."""
    reward = {"p0": lambda c: c[0] % 2, "p1": lambda c: c[-1] % 3, "p2": lambda c: sum(c) % 5,
              "p3": lambda c: -(c[0] % 4), "solo": lambda c: sum(c) % 3}[pid]
    return [Trajectory([Turn(p, c.response_ids, c.logprobs, reward=float(reward(c.response_ids)),
                             policy_id=pid)], group_id=f"{step}|{pid}|{i // 4}", policy_id=pid)
            for i, (p, c) in enumerate(zip(prompts, comps))]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def flatten(results: dict[str, dict[str, float]]) -> dict[str, float]:
    return {f"policy/{p}/{k}": v for p, metrics in results.items() for k, v in metrics.items()}


def test_four_adapters_train_in_one_run_with_separate_metrics_and_frozen_snapshots(
        ray_session, tiny_model_dir, tmp_path):
    policies = [lora_policy(tiny_model_dir, pid, algo, 1e-2 * (1 + i))
                for i, (pid, algo) in enumerate(ALGOS.items())]
    solo_cfg = PolicyConfig(id="solo", model=ModelConfig(path=str(tiny_model_dir)),
                            rollout={"sampling": SamplingConfig(max_new_tokens=4)},
                            resources={"num_workers": 1, "cpus_per_worker": 1})
    # The controller groups the four LoRA policies into one pool (one base) and gives the
    # full-weight policy its own: two pools of Ray actors.
    ctl = Controller([*policies, solo_cfg], RuntimeConfig(backend="ray"), RunDir(tmp_path))
    adapters, solo = ctl.pool_of("p0"), ctl.pool_of("solo")
    try:
        assert len(ctl.pools) == 2 and all(ctl.pool_of(p) is adapters for p in ALGOS)
        tok = adapters.tokenizer
        prompts = [[tok.bos_token_id] + tok.encode(f"{a}*{a}=") for a in range(2) for _ in range(4)]
        rows, seen, snap_weights = [], {}, None
        for step in range(3):
            comps = {pid: ctl.handle(pid).generate(prompts) for pid in [*ALGOS, "solo"]}
            batches = {pid: trajectories(pid, prompts, c, step) for pid, c in comps.items()}
            seen[step] = batches["p1"]
            rows.append(flatten(ctl.learn(batches)))
            if step == 0:
                snap = adapters.snapshot("p0", tag="v1")
                snap_weights = adapters.weights(snap)
        # One metrics row per step, every policy under its own prefix, values its own.
        for pid in [*ALGOS, "solo"]:
            assert all(f"policy/{pid}/actor/loss" in row for row in rows)
        grad_norms = {pid: rows[-1][f"policy/{pid}/actor/grad_norm"] for pid in ALGOS}
        assert len(set(grad_norms.values())) == 4, grad_norms
        assert {pid: adapters.version_of(pid) for pid in ALGOS} == dict.fromkeys(ALGOS, 3)
        assert solo.version == 3
        # The snapshot is frozen at its source's version-1 weights while p0 trained on.
        assert snap == "p0@v1" and adapters.version_of(snap) == 1
        assert max_diff(adapters.weights(snap), snap_weights) == 0.0
        assert max_diff(adapters.weights("p0"), snap_weights) > 1e-4
        assert len(ctl.handle(snap).generate(prompts[:2])) == 2
        with pytest.raises(ValueError, match="frozen snapshot"):
            adapters.train(seen[0], adapter=snap)
        # p1 trained beside three other adapters on one base equals p1 trained alone.
        alone = LocalPool([lora_policy(tiny_model_dir, "p1", "rloo", 2e-2)], seed=1)
        for step in range(3):
            alone.train(seen[step])
        assert max_diff(adapters.weights("p1"), alone.weights()) < 1e-5
        assert max_diff(adapters.weights("p1"), adapters.weights("p2")) > 1e-4
    finally:
        ctl.shutdown()
