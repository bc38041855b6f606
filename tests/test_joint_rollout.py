"""LM policies on one pool act in one call: a tick's policies and snapshots decode as one batch
(each row with its own LoRA adapter, or its own full weights) and give what each gives on its
own; an error stays with the policy that raised it."""

from __future__ import annotations

import logging

import pytest
import torch

from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import ModelConfig, PolicyConfig
from agentrt.controller.loop import PolicyHandle
from agentrt.policies.lm import LMPolicy, PromptTemplate
from agentrt.runtime.pool import LocalPool
from agentrt.runner.core import EpisodeRunner, RunnerConfig, specs

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=3)
SHORT = PromptTemplate(first="{observation}\n> ", turn="\n{observation}\n> ")


def _perturb(pool: LocalPool, adapter: str, seed: int) -> None:
    """Random LoRA B matrices for ``adapter`` (peft starts them at zero: every adapter would
    give the base model's output), or noise on a full-weight policy's projections."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in pool.worker.shared.model.named_parameters():
            if "lora_B" in name and f".{adapter}." in name:
                p.normal_(0, 0.5)
            elif not pool.worker.shared.is_lora and name.endswith("proj.weight"):
                p.add_(0.05 * torch.randn_like(p))


def _cfgs(model_dir, lora: bool = True) -> list[PolicyConfig]:
    return [PolicyConfig(id=pid, model=ModelConfig(path=str(model_dir)), lora={"enabled": lora},
                         rollout={"sampling": GREEDY}) for pid in ("p", "q")[:1 + lora]]


@pytest.fixture(scope="module", params=["lora", "full"])
def pool(request, tiny_model_dir):
    """Three players on one pool: LoRA policies p, q and p's snapshot p@0; or a full-weight
    policy p and its snapshots p@0, p@1 (full-weight policies do not share pools)."""
    lora = request.param == "lora"
    pool = LocalPool(_cfgs(tiny_model_dir, lora), seed=0)
    _perturb(pool, "p", 1)
    if lora:
        _perturb(pool, "q", 2)
    pool.snapshot("p", "0")
    _perturb(pool, "p", 3)  # p has moved on from its snapshot p@0
    if not lora:
        pool.snapshot("p", "1")
        _perturb(pool, "p", 4)
    pool.keys = ("p", "q", "p@0") if lora else ("p", "p@1", "p@0")
    return pool


class _Counted:
    """Counts the calls of the pool's HF rollout (the real one runs them)."""

    def __init__(self, pool: LocalPool) -> None:
        self.hf, self.calls = pool.worker.shared.hf, 0
        self._generate = self.hf.generate

    def __enter__(self) -> _Counted:
        def generate(*args, **kwargs):
            self.calls += 1
            return self._generate(*args, **kwargs)

        self.hf.generate = generate
        return self

    def __exit__(self, *exc) -> None:
        del self.hf.generate


def test_generate_many_is_one_mixed_batch_equal_to_each_adapter_alone(pool):
    tok = pool.tokenizer
    prompts = [[tok.bos_token_id] + tok.encode(f"{a}+{b}=") for a in range(3) for b in range(3)]
    p, q, p0 = pool.keys
    requests = [(prompts[:4], None, p), (prompts[2:7], GREEDY, q), (prompts, None, p0)]
    alone = [pool.generate(ps, s, adapter=n) for ps, s, n in requests]
    with _Counted(pool) as counted:
        mixed = pool.generate_many(requests)
    assert counted.calls == 1
    for a, b in zip(alone, mixed):
        assert [c.response_ids for c in a] == [c.response_ids for c in b]
        for x, y in zip(a, b):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs),
                                       atol=1e-5, rtol=0)
    # the adapters really differ: p and its snapshot answer the same prompts differently
    assert [c.response_ids for c in mixed[0]] != [c.response_ids for c in mixed[2][:4]]
    # different sampling configs cannot share a batch: one call per request
    with _Counted(pool) as counted:
        out = pool.generate_many([(prompts[:2], GREEDY, p), ([], GREEDY, p0),
                                  (prompts[:2], GREEDY.model_copy(update={"max_new_tokens": 2}),
                                   q)])
    assert counted.calls == 2 and out[1] == [] and len(out[2]) == 2  # nothing asked, no call


def test_a_ray_pool_decodes_the_joint_batch_as_the_local_pool_does(ray_session, pool,
                                                                   tiny_model_dir):
    from agentrt.runtime.ray_pool import PolicyPool

    remote = PolicyPool(_cfgs(tiny_model_dir, pool.worker.shared.is_lora), seed=0)
    try:
        remote.load_state_dict(pool.state_dict())  # the adapters and the snapshot p@0
        tok = pool.tokenizer
        prompts = [[tok.bos_token_id] + tok.encode(f"{a}*{a}=") for a in range(6)]
        p, q, p0 = pool.keys
        requests = [(prompts, None, q), (prompts[:3], None, p0), (prompts[2:], None, p)]
        local, there = pool.generate_many(requests), remote.generate_many(requests)
        assert [[c.response_ids for c in out] for out in there] == [
            [c.response_ids for c in out] for out in local]
    finally:
        remote.shutdown()


class _Alone(LMPolicy):
    """Acts on its own, as before policies on one pool acted together: a subclass with its own
    ``act`` is never passed by a joint call."""

    def act(self, requests):
        return super().act(requests)


def _play(pool, cls, memory=None, errors: str = "raise"):
    """Games p against q, and p against p@0 (``memory``: q's hook)."""
    p, q, p0 = pool.keys
    players = {key: cls(PolicyHandle(pool, key, pool.policies[key.split("@")[0]]),
                        templates=SHORT, sampling=GREEDY, memory=memory if key == q else None)
               for key in pool.keys}
    runner = EpisodeRunner(players, RunnerConfig(concurrency=8, policy_errors=errors))
    episodes = (specs("Bargain-v0", (p, q), 4, env_kwargs={"max_turns": 4})
                + specs("Bargain-v0", (p, p0), 4, seed=10, env_kwargs={"max_turns": 4}))
    return runner.run(episodes)


def test_a_tick_of_policies_on_one_pool_plays_what_they_play_alone(pool):
    with _Counted(pool) as counted:
        together = _play(pool, LMPolicy)
    alone = _play(pool, _Alone)
    assert _Alone(PolicyHandle(pool, "p", pool.policies["p"])).joint_key is None
    assert [(t.policy_id, [turn.response_ids for turn in t.turns])
            for t in together.trajectories] == [
        (t.policy_id, [turn.response_ids for turn in t.turns]) for t in alone.trajectories]
    assert [r.returns for r in together.episodes] == [r.returns for r in alone.episodes]
    # every tick is one mixed batch; acting alone is one call per policy and tick
    ticks = max(sum(len(t.turns) for t in together.trajectories if t.episode_id == r.episode_id)
                for r in together.episodes)
    assert counted.calls == ticks
    assert together.metrics["rollout/calls/p"] == alone.metrics["rollout/calls/p"]


def test_an_error_in_one_policy_of_a_joint_call_stays_with_it(pool, caplog):
    def broken(requests):
        raise RuntimeError("memory bank unreachable")

    with caplog.at_level(logging.WARNING, logger="agentrt.runner.joint"):
        result = _play(pool, LMPolicy, memory=broken, errors="record")
    assert "failed acting together (RuntimeError: memory bank unreachable)" in caplog.text
    p, q, _ = pool.keys
    assert all(r.ended_by == "policy_error" for r in result.episodes if q in r.seats.values())
    # p against its snapshot plays on: q's error did not take p's actions with it
    pq0 = [r for r in result.episodes if q not in r.seats.values()]
    assert len(pq0) == 4 and all(r.ended_by != "policy_error" for r in pq0)
    assert all(len(t.turns) > 0 for t in result.trajectories if t.policy_id == p)
    with pytest.raises(RuntimeError, match="memory bank unreachable"):
        _play(pool, LMPolicy, memory=broken, errors="raise")
