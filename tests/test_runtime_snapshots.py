"""A LoRA league in one pool: two learners and 20 frozen snapshots are 22 adapters on one base.

bench/league_memory.py measures what this costs (peak RSS vs the same league without snapshots);
this test checks the bookkeeping: every snapshot is one adapter of the shared model, registered
with its source's version, different from the snapshots before it, and generating.
"""

from __future__ import annotations

import pytest
import torch

from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import ModelConfig, PolicyConfig
from agentrt.runtime.pool import LocalPool
from agentrt.core.types import Trajectory, Turn

LEARNERS = ("p0", "p1")
ROUNDS = 10  # one step and one snapshot per learner each round: 20 snapshots


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and do not fight other processes for cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def lora_policy(model_dir, pid: str) -> PolicyConfig:
    return PolicyConfig(id=pid, model=ModelConfig(path=str(model_dir)), lora={"enabled": True},
                        optim={"lr": 3e-2}, micro_batch_size=8,
                        rollout={"sampling": SamplingConfig(max_new_tokens=4)})


def train_step(pool: LocalPool, pid: str, prompts: list[list[int]]) -> None:
    comps = pool.generate(prompts, adapter=pid)
    pool.train([Trajectory([Turn(p, c.response_ids, c.logprobs, policy_id=pid,
                                 reward=float(c.response_ids[0] % 2))],
                           group_id=str(i // 4), policy_id=pid)
                for i, (p, c) in enumerate(zip(prompts, comps))], adapter=pid)


def test_twenty_snapshots_are_adapters_of_one_base_and_all_generate(tiny_model_dir):
    pool = LocalPool([lora_policy(tiny_model_dir, pid) for pid in LEARNERS], seed=0)
    tok = pool.tokenizer
    prompts = [[tok.bos_token_id] + tok.encode(f"{a}*{a}=") for a in range(2) for _ in range(4)]
    snaps = []
    for k in range(ROUNDS):
        for pid in LEARNERS:
            train_step(pool, pid, prompts)
            snaps.append(pool.snapshot(pid, f"r{k}"))
    model = pool.learner.model
    assert sorted(model.peft_config) == sorted([*LEARNERS, *snaps])  # 22 adapters, one base
    assert len(model.peft_config) == 22
    assert sorted(pool.worker.snapshots) == sorted(snaps) and len(snaps) == 20
    assert {pool.version_of(s) for s in snaps if s.startswith("p0@")} == set(range(1, 11))
    # No snapshot is a copy of the one before it: the learner trained in between.
    for pid in LEARNERS:
        mine = [pool.weights(s) for s in snaps if s.startswith(pid + "@")]
        for a, b in zip(mine, mine[1:]):
            assert max(float((a[k] - b[k]).abs().max()) for k in a) > 0.0
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=4)
    for name in snaps:
        out = pool.generate(prompts[:2], greedy, adapter=name)
        assert len(out) == 2 and all(c.response_ids for c in out), name
    # Dropping the snapshots leaves the two learners.
    for name in snaps:
        pool.drop_snapshot(name)
    assert sorted(model.peft_config) == list(LEARNERS) and not pool.worker.snapshots
