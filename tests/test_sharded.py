"""Sharded training (``resources.sharding: fsdp``): 2 Ray workers with FSDP2 over gloo take the
step of 1 unsharded worker, hold half its training state, and checkpoint in the unsharded
format (a checkpoint of 2 sharded workers resumes on 1 and on 2).

Real Ray actors, real torch FSDP2 (``fully_shard``) over real gloo, a real tiny model.
"""

from __future__ import annotations

import copy

import pytest
import torch

from agentrt.algos.config import AlgorithmConfig
from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import ModelConfig, PolicyConfig
from agentrt.runtime.pool import LocalPool
from agentrt.runtime.ray_pool import PolicyPool
from tests.test_runtime_pool import make_batches, max_diff

STEPS = 5


def sharded_policy(model_dir, lora: bool = False, sharding: str = "fsdp") -> PolicyConfig:
    """PPO with a critic and KL to a reference, or GRPO on LoRA; 2 mini-batches of 5 rows
    (:func:`batches`): 2 rows for worker 0, 3 for worker 1, in passes of 2 rows, so worker 0
    runs an extra pass that only joins the collectives. Half a CPU a worker: two pools fit the
    session's 2-CPU Ray."""
    algo = (AlgorithmConfig(name="grpo", mini_batches=2) if lora else
            AlgorithmConfig(name="ppo", kl={"coef": 0.05}, mini_batches=2, critic_lr=1e-3))
    return PolicyConfig(model=ModelConfig(path=str(model_dir)), algorithm=algo,
                        lora={"enabled": lora, "r": 4}, micro_batch_size=2,
                        optim={"lr": 1e-3},
                        rollout={"sampling": SamplingConfig(max_new_tokens=5)},
                        resources={"num_workers": 2, "cpus_per_worker": 0.5,
                                   "sharding": sharding})


def batches(pool, n: int, seed: int = 0):
    """``n`` batches of 10 trajectories sampled once before training."""
    return [trajs[:10] for trajs in make_batches(pool, n, seed)]


@pytest.fixture(scope="module")
def sharded(ray_session, tiny_model_dir):
    pool = PolicyPool(sharded_policy(tiny_model_dir), seed=0)
    yield pool
    pool.shutdown()


def test_two_sharded_workers_take_the_unsharded_step(sharded, tiny_model_dir):
    local = LocalPool(sharded_policy(tiny_model_dir, sharding="none"), seed=0)
    start = local.weights()
    assert max_diff(sharded.weights(), start) == 0.0
    steps = batches(local, STEPS)
    for step, trajs in enumerate(steps):
        m_pool, m_local = sharded.train(trajs), local.train(trajs)
        for key in ("actor/loss", "actor/grad_norm", "critic/loss", "critic/grad_norm"):
            assert m_pool[key] == pytest.approx(m_local[key], rel=1e-5, abs=1e-6), (step, key)
    diff = max_diff(sharded.weights(), local.weights())
    print(f"\nFSDP 2 workers vs 1 unsharded: max abs weight diff {diff:.2e} after {STEPS} "
          "PPO steps")
    assert max_diff(local.weights(), start) > 1e-3  # it trained
    assert diff < 1e-5
    # The rollout runs on the gathered weights: the same greedy tokens as the unsharded model.
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=4)
    prompts = [t.turns[0].prompt_ids for t in steps[0][::4]]
    assert ([c.response_ids for c in sharded.generate(prompts, greedy)]
            == [c.response_ids for c in local.generate(prompts, greedy)])
    # Each worker holds half of the trained parameters, gradients and AdamW state.
    held = sharded._call(lambda w: w.held_bytes)
    whole = local.worker.held_bytes()
    for worker in held:
        for key in ("params", "grads", "optimizer"):
            assert worker[key] <= 0.51 * whole[key], (key, worker, whole)
        assert worker["rollout_copy"] == whole["params"]  # the rollout's gathered weights


def test_a_checkpoint_of_two_sharded_workers_resumes_on_one_and_on_two(sharded, tiny_model_dir):
    local = LocalPool(sharded_policy(tiny_model_dir, sharding="none"), seed=0)
    state = sharded.state_dict()  # full weights, optimizer state index-keyed in full
    assert all(not hasattr(v, "device_mesh") for s in
               state["policies"]["policy"]["optimizer"]["state"].values() for v in s.values())
    local.load_state_dict(copy.deepcopy(state))  # an in-process optimizer takes the tensors
    resumed = batches(local, 2, seed=1)
    for trajs in resumed:
        sharded.train(trajs)
        local.train(trajs)
    after = sharded.weights()
    assert max_diff(after, local.weights()) < 1e-5  # resumed on 1
    sharded.load_state_dict(state)  # resumed on 2 sharded workers, from the same checkpoint
    for trajs in resumed:
        sharded.train(trajs)
    assert max_diff(sharded.weights(), after) < 1e-5
    assert sharded.version == local.version


def test_lora_policy_sharded_takes_the_unsharded_step(ray_session, tiny_model_dir):
    pool = PolicyPool(sharded_policy(tiny_model_dir, lora=True), seed=0)
    try:
        local = LocalPool(sharded_policy(tiny_model_dir, lora=True, sharding="none"), seed=0)
        start = local.weights()
        for trajs in batches(local, 2):
            m_pool, m_local = pool.train(trajs), local.train(trajs)
            assert m_pool["actor/loss"] == pytest.approx(m_local["actor/loss"], rel=1e-5,
                                                         abs=1e-6)
        assert max_diff(local.weights(), start) > 1e-4
        assert max_diff(pool.weights(), local.weights()) < 1e-5
        held = pool._call(lambda w: w.held_bytes)
        assert all(h["rollout_copy"] == local.worker.held_bytes()["params"] for h in held)
    finally:
        pool.shutdown()


@pytest.mark.parametrize("policy, runtime, match", [
    ({"rollout": {"backend": "vllm"}}, "ray", "rollout.backend is vllm"),
    ({"compile": True}, "ray", "compile is true"),
    ({}, "local", "policy.resources.sharding: fsdp shards over a pool's Ray workers"),
])
def test_sharding_refuses_what_it_does_not_run_in_one_line(policy, runtime, match):
    from agentrt.workloads.prompts.config import TrainConfig

    cfg = {"policy": {**policy, "resources": {"num_workers": 2, "sharding": "fsdp"}},
           "runtime": {"backend": runtime}}
    with pytest.raises(ValueError, match=match):
        TrainConfig.model_validate(cfg)


def test_a_non_finite_loss_on_one_worker_skips_the_step_on_both(ray_session, tiny_model_dir):
    """A NaN reward in the last GRPO group (rows 8-9: worker 1's) makes worker 1's loss NaN
    and worker 0's finite: worker 1 goes on with its passes (each communicates), both skip the
    step alike, and the run goes on equal to an unsharded one."""
    cfg = sharded_policy(tiny_model_dir)
    cfg = cfg.model_copy(update={"algorithm": AlgorithmConfig(name="grpo", mini_batches=1)})
    pool = PolicyPool(cfg, seed=0)
    try:
        local = LocalPool(cfg.model_copy(update={"resources": {"num_workers": 1}}), seed=0)
        poisoned, clean = batches(local, 2, seed=2)
        poisoned[9].turns[0].reward = float("nan")
        m_pool, m_local = pool.train(poisoned), local.train(poisoned)
        assert m_pool["actor/skipped"] == m_local["actor/skipped"] == 1.0
        pool.train(clean)
        local.train(clean)
        assert max_diff(pool.weights(), local.weights()) < 1e-5
    finally:
        pool.shutdown()
