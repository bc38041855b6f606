"""Many LoRA policies in one vLLM engine: per-request routing, isolated updates, snapshots, LRU.

Three LoRA policies share the llama-tiny base. Each is a real HybridEngine (peft adapter) whose
lora_B is randomised so the three adapters give clearly different greedy outputs (a fresh
adapter has B = 0 and equals the base). Every expected output is HF ``generate`` of that
policy's own peft model at the time of the check.
"""

from __future__ import annotations

import pytest
import torch
from vllm_testlib import grpo_step, make_prompts, policy_config

from agentrt.config.sections import SamplingConfig
from agentrt.runtime.learner import HybridEngine

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=10)
NAMES = ["p0", "p1", "p2"]


def randomise_lora_b(engine: HybridEngine, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in engine.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def peft_config(engine: HybridEngine):
    return engine.model.peft_config[engine.policy_id]


@pytest.fixture(scope="module")
def served(tiny_model_dir, engine_factory):
    """(rollout, {name: HybridEngine}, base HF engine) with the three adapters registered."""
    rollout = engine_factory(tiny_model_dir, lora_rank=8)
    policies = {}
    for k, name in enumerate(NAMES):
        eng = HybridEngine(policy_config(tiny_model_dir, lora=True, lr=2e-2, id=name), seed=k)
        randomise_lora_b(eng, 100 + k)
        rollout.sync_from(eng)  # registers adapter `name` at the policy's version
        policies[name] = eng
    base = HybridEngine(policy_config(tiny_model_dir), seed=0)
    return rollout, policies, base


def hf_greedy(engine: HybridEngine, prompts):
    return [c.response_ids for c in engine.generate(prompts, GREEDY)]


def test_three_adapters_in_one_batch_follow_their_own_policy(served):
    rollout, policies, _ = served
    prompts = make_prompts(8, seed=20)
    routed = [(p, NAMES[i % 3]) for i, p in enumerate(prompts * 3)]  # interleaved policies
    out = rollout.generate([p for p, _ in routed], GREEDY, adapters=[n for _, n in routed])
    want = {name: dict(zip(map(tuple, prompts), hf_greedy(eng, prompts)))
            for name, eng in policies.items()}
    for (prompt, name), comp in zip(routed, out):
        assert comp.response_ids == want[name][tuple(prompt)], name
    per_policy = {name: [want[name][tuple(p)] for p in prompts] for name in NAMES}
    assert len({str(v) for v in per_policy.values()}) == 3  # the adapters really differ


def test_base_rows_batched_with_adapter_rows_get_the_base_model(served):
    rollout, _, base = served
    prompts = make_prompts(4, seed=21)
    out = rollout.generate(prompts, GREEDY, adapters=[None, "p0", None, "p2"])
    want = hf_greedy(base, prompts)
    assert out[0].response_ids == want[0]
    assert out[2].response_ids == want[2]
    assert out[1].response_ids != want[1]


def test_training_one_policy_leaves_the_others_and_its_snapshot(served):
    rollout, policies, _ = served
    prompts = make_prompts(8, seed=22)
    learner = policies["p1"]
    rollout.add_adapter("p1@v0", learner.trainable_state(), peft_config(learner), version=0)
    before = {name: [c.response_ids for c in rollout.generate(prompts, GREEDY, adapters=name)]
              for name in ["p0", "p1", "p2", "p1@v0"]}
    group = 4
    for step in range(2):
        train_prompts = [p for p in make_prompts(8, seed=30 + step) for _ in range(group)]
        comps = rollout.generate(train_prompts, learner.cfg.rollout.sampling, adapters="p1",
                                 seeds=range(len(train_prompts)))
        grpo_step(learner, comps, train_prompts, group)
        rollout.sync_from(learner)  # update_adapter("p1", ...): a new version folder
    assert rollout.adapter_version("p1") == 2
    assert rollout.adapter_version("p0") == 0
    after = {name: [c.response_ids for c in rollout.generate(prompts, GREEDY, adapters=name)]
             for name in before}
    assert after["p1"] == hf_greedy(learner, prompts)
    assert after["p1"] != before["p1"]  # the update reached the engine
    assert after["p0"] == before["p0"]
    assert after["p2"] == before["p2"]
    assert after["p1@v0"] == before["p1@v0"] == before["p1"]  # the frozen snapshot stayed


def test_resident_cap_evicts_least_recently_used(served):
    rollout, policies, _ = served
    cap = rollout.adapters.capacity
    extra = {"q0": "p0", "q1": "p2"}  # two more adapters that copy known policies' weights
    for name, src in extra.items():
        if name not in rollout.adapters:
            eng = policies[src]
            rollout.add_adapter(name, eng.trainable_state(), peft_config(eng), version=eng.version)
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
        assert got[name] == hf_greedy(policies[src], prompts)
    for name in NAMES:
        assert got[name] == hf_greedy(policies[name], prompts)


def test_removed_adapter_is_gone(served):
    rollout, policies, _ = served
    eng = policies["p0"]
    rollout.add_adapter("tmp", eng.trainable_state(), peft_config(eng))
    rollout.generate(make_prompts(1, seed=24), GREEDY, adapters="tmp")
    tmp_id = rollout.adapters.get("tmp").int_id
    rollout.remove_adapter("tmp")
    assert "tmp" not in rollout.adapters
    assert tmp_id not in rollout.engine_resident_ids()
    with pytest.raises(KeyError, match="no adapter named 'tmp'"):
        rollout.generate(make_prompts(1, seed=24), GREEDY, adapters="tmp")
