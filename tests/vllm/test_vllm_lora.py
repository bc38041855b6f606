"""Many LoRA policies in one vLLM engine: per-request routing, isolated updates, snapshots, LRU.

Three LoRA policies share the llama-tiny base the way a pool worker hosts them: one
``SharedModel`` with ``rollout.backend: vllm`` (one engine) and a Learner per policy (a peft
adapter each), whose lora_B is randomised so the three adapters give clearly different greedy
outputs (a fresh adapter has B = 0 and equals the base). The engine gets every adapter, update and
snapshot through the live path (``Learner.sync_rollout`` and ``SharedModel.freeze`` /
``drop``, both ``SharedModel.sync``). Every expected output is HF ``generate`` of the shared peft
model as that policy at the time of the check.
"""

from __future__ import annotations

import pytest
import torch
from vllm_testlib import grpo_step, make_prompts, policy_config

from agentrt.config.rollout import SamplingConfig
from agentrt.runtime.learner import Learner
from agentrt.runtime.shared_model import SharedModel

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=10)
NAMES = ["p0", "p1", "p2"]


def randomise_lora_b(engine: Learner, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in engine.model.named_parameters():
            if f"lora_B.{engine.policy_id}." in name:  # this policy's adapter only
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    """(rollout, {name: Learner}, shared model) with the three adapters registered."""
    cfgs = [policy_config(tiny_model_dir, lora=True, lr=2e-2, id=name, backend="vllm")
            for name in NAMES]
    shared = SharedModel(cfgs[0], seed=0)  # starts the one engine (LoRA on)
    policies = {}
    for k, cfg in enumerate(cfgs):
        eng = Learner(cfg, seed=k, shared=shared)  # its adapter joins the engine, version 0
        randomise_lora_b(eng, 100 + k)
        eng.sync_rollout()  # update_adapter(cfg.id, ...): the randomised weights
        policies[cfg.id] = eng
    yield shared.vllm, policies, shared
    shared.close()


def hf_greedy(shared: SharedModel, name: str | None, prompts):
    """HF generate of the shared peft model as ``name`` (None: the bare base model)."""
    with shared.using(name):
        return [c.response_ids for c in shared.hf.generate(prompts, GREEDY)]


def test_three_adapters_in_one_batch_follow_their_own_policy(served):
    rollout, policies, shared = served
    prompts = make_prompts(8, seed=20)
    routed = [(p, NAMES[i % 3]) for i, p in enumerate(prompts * 3)]  # interleaved policies
    out = rollout.generate([p for p, _ in routed], GREEDY, adapters=[n for _, n in routed])
    want = {name: dict(zip(map(tuple, prompts), hf_greedy(shared, name, prompts)))
            for name in policies}
    for (prompt, name), comp in zip(routed, out):
        assert comp.response_ids == want[name][tuple(prompt)], name
    per_policy = {name: [want[name][tuple(p)] for p in prompts] for name in NAMES}
    assert len({str(v) for v in per_policy.values()}) == 3  # the adapters really differ


def test_base_rows_batched_with_adapter_rows_get_the_base_model(served):
    rollout, _, shared = served
    prompts = make_prompts(4, seed=21)
    out = rollout.generate(prompts, GREEDY, adapters=[None, "p0", None, "p2"])
    want = hf_greedy(shared, None, prompts)
    assert out[0].response_ids == want[0]
    assert out[2].response_ids == want[2]
    assert out[1].response_ids != want[1]


def test_training_one_policy_leaves_the_others_and_its_snapshot(served):
    rollout, policies, shared = served
    prompts = make_prompts(8, seed=22)
    learner = policies["p1"]
    shared.freeze("p1", "p1@v0")  # a snapshot: one more adapter, registered with the engine
    before = {name: [c.response_ids for c in rollout.generate(prompts, GREEDY, adapters=name)]
              for name in ["p0", "p1", "p2", "p1@v0"]}
    group = 4
    for step in range(2):
        train_prompts = [p for p in make_prompts(8, seed=30 + step) for _ in range(group)]
        comps = rollout.generate(train_prompts, learner.cfg.rollout.sampling, adapters="p1",
                                 seeds=range(len(train_prompts)))
        grpo_step(learner, comps, train_prompts, group)  # update_adapter("p1", ...) in update
    assert rollout.adapter_version("p1") == 2
    assert rollout.adapter_version("p0") == 0
    after = {name: [c.response_ids for c in rollout.generate(prompts, GREEDY, adapters=name)]
             for name in before}
    assert after["p1"] == hf_greedy(shared, "p1", prompts)
    assert after["p1"] != before["p1"]  # the update reached the engine
    assert after["p0"] == before["p0"]
    assert after["p2"] == before["p2"]
    assert after["p1@v0"] == before["p1@v0"] == before["p1"]  # the frozen snapshot stayed


def test_resident_cap_evicts_least_recently_used(served):
    rollout, _, shared = served
    cap = rollout.adapters.capacity
    extra = {"q0": "p0", "q1": "p2"}  # two more adapters: snapshots of untrained policies
    for name, src in extra.items():
        if name not in shared.names():
            shared.freeze(src, name)
    names = rollout.adapters.names
    assert len(names) > cap
    prompts = make_prompts(2, seed=23)
    evictions = rollout.adapters.evictions
    routed = [(p, n) for n in names for p in prompts]
    out = rollout.generate([p for p, _ in routed], GREEDY, adapters=[n for _, n in routed])
    resident = rollout.adapters.resident
    assert len(resident) <= cap
    assert rollout.engine_resident_ids() == {rollout.adapters.get(n).int_id for n in resident}
    assert rollout.adapters.evictions > evictions
    got = {}
    for (p, n), comp in zip(routed, out):
        got.setdefault(n, []).append(comp.response_ids)
    for name, src in extra.items():
        assert got[name] == hf_greedy(shared, src, prompts)
    for name in NAMES:
        assert got[name] == hf_greedy(shared, name, prompts)


def test_removed_adapter_is_gone(served):
    rollout, _, shared = served
    shared.freeze("p0", "tmp")
    rollout.generate(make_prompts(1, seed=24), GREEDY, adapters="tmp")
    tmp_id = rollout.adapters.get("tmp").int_id
    shared.drop("tmp")  # the snapshot leaves the model and the engine
    assert "tmp" not in rollout.adapters
    assert tmp_id not in rollout.engine_resident_ids()
    with pytest.raises(KeyError, match="no adapter named 'tmp'"):
        rollout.generate(make_prompts(1, seed=24), GREEDY, adapters="tmp")
