"""One vLLM engine serves a whole LoRA league: 2 learners + 20 frozen snapshots = 22 adapters.

The league is a real :class:`~agentrt.runtime.pool.LocalPool` with ``rollout.backend: vllm``: two LoRA
learners on llama-tiny train GRPO steps on rollouts sampled by the engine, and after every step
each is frozen into a snapshot (``pool.snapshot``), so the 20 snapshots hold 20 different
adapters. The engine keeps the default residency caps (``max_resident_adapters`` 8,
``max_loras`` 4), so serving 22 adapters evicts and reloads them from their folders.

Reference: a second pool with ``rollout.backend: hf`` that loads the league's checkpoint
(``pool.state_dict()``: the learners' adapters and every snapshot's) and generates with HF
``generate``. fp32 on both sides, so greedy outputs must be equal token for token.
"""

from __future__ import annotations

import time

import pytest
import torch
from vllm_testlib import low_byte_reward, make_prompts

from agentrt.config.rollout import RolloutConfig, SamplingConfig, VLLMConfig
from agentrt.config.sections import ModelConfig, PolicyConfig
from agentrt.runtime.pool import LocalPool
from agentrt.core.types import Trajectory, Turn

LEARNERS = ("p0", "p1")
ROUNDS = 10  # one GRPO step and one snapshot per learner each round: 20 snapshots
GROUP = 4
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=16)
# Default adapter caps (the point: 22 adapters through 8 resident slots); a small KV cache
# because the machine is shared.
ENGINE = VLLMConfig(kv_cache_gib=0.25, max_model_len=1024, max_num_seqs=64)
# The learners want opposite things, so their snapshots drift apart.
REWARDS = {"p0": low_byte_reward, "p1": lambda ids: 1.0 - low_byte_reward(ids)}


def league_policy(model_dir, pid: str, backend: str) -> PolicyConfig:
    return PolicyConfig(
        id=pid, model=ModelConfig(path=str(model_dir)),
        lora={"enabled": True, "r": 8, "alpha": 16}, optim={"lr": 3e-2}, micro_batch_size=32,
        rollout=RolloutConfig(backend=backend, vllm=ENGINE,
                              sampling=SamplingConfig(temperature=1.0, max_new_tokens=8)))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and do not fight other processes for cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def league(tiny_model_dir, one_thread):
    """(vLLM pool, snapshot names, seconds to build) after 20 steps and 20 snapshots."""
    start = time.perf_counter()
    pool = LocalPool([league_policy(tiny_model_dir, pid, "vllm") for pid in LEARNERS], seed=0)
    snaps = []
    for k in range(ROUNDS):
        for pid in LEARNERS:
            prompts = [p for p in make_prompts(8, seed=100 * k + len(snaps)) for _ in range(GROUP)]
            comps = pool.generate(prompts, adapter=pid)  # sampled by the engine
            pool.train([Trajectory([Turn(p, c.response_ids, c.logprobs, policy_id=pid,
                                         reward=REWARDS[pid](c.response_ids))],
                                   group_id=str(i // GROUP), policy_id=pid)
                        for i, (p, c) in enumerate(zip(prompts, comps))], adapter=pid)
            snaps.append(pool.snapshot(pid, f"r{k}"))
    yield pool, snaps, time.perf_counter() - start
    pool.shutdown()


def test_twenty_snapshots_differ_and_all_22_are_registered(league):
    pool, snaps, seconds = league
    print(f"league of 2 learners + {len(snaps)} snapshots built in {seconds:.0f} s")
    engine = pool.worker.shared.vllm
    assert len(snaps) == 20 and len(set(snaps)) == 20
    assert sorted(engine.adapters.names) == sorted([*LEARNERS, *snaps])
    weights = {name: pool.weights(name) for name in snaps}
    for i, a in enumerate(snaps):
        for b in snaps[i + 1:]:
            diff = max(float((weights[a][k] - weights[b][k]).abs().max()) for k in weights[a])
            assert diff > 1e-4, f"{a} and {b} hold the same adapter"
    for k, name in enumerate(snaps):  # each snapshot keeps its source's version at freezing
        assert pool.version_of(name) == k // 2 + 1


def test_every_adapter_greedy_equals_hf_generate(league, tiny_model_dir):
    pool, snaps, _ = league
    engine = pool.worker.shared.vllm
    names = [*LEARNERS, *snaps]
    prompts = make_prompts(32, seed=1)
    start = time.perf_counter()
    hf = LocalPool([league_policy(tiny_model_dir, pid, "hf") for pid in LEARNERS], seed=1)
    hf.load_state_dict(pool.state_dict())  # the learners' and every snapshot's adapter
    evictions_before = engine.adapters.evictions
    served, want = {}, {}
    for name in names:
        served[name] = [c.response_ids for c in pool.generate(prompts, GREEDY, adapter=name)]
        want[name] = [c.response_ids for c in hf.generate(prompts, GREEDY, adapter=name)]
    for name in names:
        bad = [i for i in range(len(prompts)) if served[name][i] != want[name][i]]
        assert not bad, f"{name}: vLLM and HF greedy outputs differ on prompts {bad}"
    # 22 adapters through max_resident_adapters slots: some were evicted and loaded again.
    assert engine.adapters.capacity < len(names)
    assert engine.adapters.evictions - evictions_before >= len(names) - engine.adapters.capacity
    assert len(engine.adapters.resident) == engine.adapters.capacity
    # The adapters really differ in what they generate (equality above is not trivial).
    with hf.worker.shared.using(None):
        base = [c.response_ids for c in hf.worker.shared.hf.generate(prompts, GREEDY)]
    distinct = {tuple(map(tuple, out)) for out in served.values()}
    assert len(distinct) > len(names) // 2, f"{len(distinct)} distinct outputs of 22 adapters"
    assert all(served[name] != base for name in names)
    # One call routed to all 22 adapters at once (waves of resident adapters) gives the same.
    rows = [(name, i) for i in range(8) for name in names]
    mixed = engine.generate([prompts[i] for _, i in rows], GREEDY, adapters=[n for n, _ in rows])
    for (name, i), comp in zip(rows, mixed):
        assert comp.response_ids == served[name][i], f"{name}, prompt {i}: mixed batch"
    print(f"22 adapters x 32 prompts, vLLM vs HF greedy: equal; {len(distinct)} distinct "
          f"outputs; evictions {engine.adapters.evictions}, loads {engine.adapters.loads}; "
          f"{time.perf_counter() - start:.0f} s")
