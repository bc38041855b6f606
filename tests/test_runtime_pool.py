"""Ray policy pool: 2 workers take exactly the 1-worker step; kill -9 of a worker mid-run.

One 2-worker pool (real Ray actors, real gloo all-reduce, real tiny model) serves both tests; the
kill test runs last because it restarts the pool's workers.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest
import torch

from agentrt.algos.config import AlgorithmConfig
from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import ModelConfig, PolicyConfig
from agentrt.runtime.pool import LocalPool
from agentrt.runtime.ray_pool import PolicyPool
from agentrt.core.types import Trajectory, Turn


def ppo_policy(model_dir, **extra) -> PolicyConfig:
    """Full weights, critic, KL to a frozen reference, 2 mini-batches of several micro-batches:
    every part of the update that data parallelism must reproduce."""
    algo = AlgorithmConfig(name="ppo", kl={"coef": 0.05}, mini_batches=2, critic_lr=1e-3)
    return PolicyConfig(model=ModelConfig(path=str(model_dir)), algorithm=algo,
                        micro_batch_size=4, optim={"lr": 1e-3},
                        rollout={"sampling": SamplingConfig(max_new_tokens=5)},
                        resources={"num_workers": 2, "cpus_per_worker": 1}, **extra)


def make_batches(pool, n_batches: int, seed: int = 0) -> list[list[Trajectory]]:
    """Trajectories collected once, before training: 12 per batch (3 prompts x 4 samples)."""
    tok = pool.tokenizer
    out = []
    for b in range(n_batches):
        prompts = [[tok.bos_token_id] + tok.encode(f"{b + a}+{c}=") for a in range(3)
                   for c in range(4)]
        comps = pool.generate(prompts)
        out.append([Trajectory([Turn(p, c.response_ids, c.logprobs, reward=float((i + b) % 3))],
                               group_id=f"{b}|{i // 4}")
                    for i, (p, c) in enumerate(zip(prompts, comps))])
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_local_pool_is_the_learner_loop_bit_for_bit(tiny_model_dir):
    """The in-process path through a pool gives exactly the learner's prepare, the advantages
    and the learner's update (the single-policy run's results did not change)."""
    from agentrt.algos.rae import RAEState
    from agentrt.core.types import collate
    from agentrt.runtime.learner import Learner
    from agentrt.runtime.steps import advantages_from

    cfg = ppo_policy(tiny_model_dir)
    local, eng = LocalPool(cfg, seed=0), Learner(cfg, seed=0)
    rae = RAEState.for_algorithm(cfg.algorithm)
    for trajs in make_batches(local, 2):
        m_pool = local.train(trajs)
        batch = collate(trajs, eng.pad_id)
        # the second batch was sampled before the first step: the pool marks it replayed
        batch.replayed = any(t.policy_version < eng.version for t in trajs)
        m_eng = eng.prepare(batch)
        m_eng |= advantages_from(batch, eng.algo, eng.kl_coef, rae) | eng.update(batch)
        assert {k: v for k, v in m_pool.items() if k in m_eng} == m_eng
    assert max_diff(local.weights(), eng.trainable_state()) == 0.0


@pytest.fixture(scope="module")
def pool(ray_session, tiny_model_dir):
    pool = PolicyPool(ppo_policy(tiny_model_dir), seed=0)
    yield pool
    pool.shutdown()


def test_two_workers_take_the_same_step_as_one(pool, tiny_model_dir):
    local = LocalPool(ppo_policy(tiny_model_dir), seed=0)
    start = local.weights()
    assert max_diff(pool.weights(), start) == 0.0  # replicas start from the same seed
    batches = make_batches(local, 2)
    for trajs in batches:
        m_pool, m_local = pool.train(trajs), local.train(trajs)
        # The all-reduced gradient is the whole batch's: same norm before clipping.
        for key in ("actor/grad_norm", "critic/grad_norm", "actor/loss", "critic/loss"):
            assert m_pool[key] == pytest.approx(m_local[key], rel=1e-5, abs=1e-6), key
    diff = max_diff(pool.weights(), local.weights())
    print(f"\n2 workers vs 1: max abs weight diff {diff:.2e} after 2 PPO steps")
    assert max_diff(local.weights(), start) > 1e-3  # it did train
    assert diff < 1e-5
    assert pool.version == local.version == 2
    # Generation is split across workers and comes back in prompt order.
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=4)
    prompts = [t.turns[0].prompt_ids for t in batches[0][::4]]
    assert ([c.response_ids for c in pool.generate(prompts, greedy)]
            == [c.response_ids for c in local.generate(prompts, greedy)])


def test_mini_batch_smaller_than_the_pool_is_a_clear_error(pool):
    trajs = make_batches(pool, 1)[0][:3]  # 3 rows in 2 mini-batches: one of 1 row, 2 workers
    with pytest.raises(ValueError, match="lower algorithm.mini_batches"):
        pool.train(trajs)


def test_kill_9_of_a_worker_mid_run_loses_no_trajectory(pool, tiny_model_dir, caplog):
    """The run finishes with the right step count and exactly the weights of an uninterrupted
    run on the same trajectories: nothing lost, nothing trained twice."""
    local = LocalPool(ppo_policy(tiny_model_dir), seed=0)
    local.load_state_dict(pool.state_dict())  # the pool's recovery point = the reference start
    batches = make_batches(local, 4, seed=1)
    start_version, victim = pool.version, pool.pids[1]
    metrics = []
    with caplog.at_level(logging.WARNING, logger="agentrt.runtime.pool"):
        kill = threading.Timer(0.2, os.kill, (victim, signal.SIGKILL))
        for step, trajs in enumerate(batches):
            if step == 2:  # kill -9 while step 2 is in flight (or just before it starts)
                kill.start()
            if step == 3:  # or, where step 2 took less than 0.2 s, before step 3 starts
                kill.join()
            metrics.append(pool.train(trajs))
            local.train(trajs)
    assert victim not in pool.pids and pool.worker_restarts == 1
    assert [m["runtime/worker_restarts"] for m in metrics][-1] == 1.0
    assert pool.replayed_calls >= 2  # steps 0 and 1 (after the recovery point) replayed
    assert pool.version == local.version == start_version + len(batches)
    assert "Restarting its workers" in caplog.text and "trajectories kept" in caplog.text
    diff = max_diff(pool.weights(), local.weights())
    print(f"\nkill -9 mid-run: recovered; max abs weight diff vs uninterrupted {diff:.2e}")
    assert diff < 1e-5



def test_a_worker_lost_while_the_pool_recovers_is_recovered_again(pool, tiny_model_dir):
    """A worker killed, then the restarted worker killed too while the pool replays its journal
    (as when Ray restarts an actor of a dead node a second time): the pool recovers again, from
    its checkpoint, and ends at the weights of an uninterrupted run."""
    local = LocalPool(ppo_policy(tiny_model_dir), seed=0)
    local.load_state_dict(pool.state_dict())
    batches = make_batches(local, 3, seed=2)
    pool.train(batches[0])
    local.train(batches[0])
    impl, args = pool._journal[-1]
    killed: list[int] = []

    def kill_then_replay(*a):  # the journal's last call, replayed by the first recovery
        if not killed:
            killed.append(pool.pids[0])  # a restarted worker: the pool knows its new pid
            os.kill(pool.pids[0], signal.SIGKILL)
        return impl(*a)

    pool._journal[-1] = (kill_then_replay, args)
    restarts, first = pool.worker_restarts, pool.pids[1]
    os.kill(first, signal.SIGKILL)
    for trajs in batches[1:]:
        pool.train(trajs)
        local.train(trajs)
    assert killed and killed[0] != first and pool.worker_restarts == restarts + 2
    assert max_diff(pool.weights(), local.weights()) < 1e-5

def test_rows_sampled_before_a_step_are_recomputed_not_taken_from_the_rollout(
        tiny_model_dir, caplog):
    """Several steps per batch on an fp32 rollout take the rollout's log-probs as the old ones,
    but not for rows older weights sampled (replayed feedback): those are recomputed, and the
    gap they carry does not switch the rollout's log-probs off for later batches."""
    local = LocalPool(ppo_policy(tiny_model_dir), seed=0)
    first, second = make_batches(local, 2)  # both sampled by version 0
    local.train(first)
    with caplog.at_level(logging.WARNING, logger="agentrt.runtime.learner"):
        metrics = local.train(second)  # trained at version 1
    assert metrics["rollout/logprob_diff"] > 1e-3  # the recompute measured the old weights' gap
    assert local.learner.rollout_matches and not caplog.records
