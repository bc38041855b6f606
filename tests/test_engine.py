"""The learner: rollout log-probs, reference models, accumulation, dtypes, bad steps."""

from __future__ import annotations

import functools

import pytest
import torch

from agentrt.algos.config import AlgorithmConfig
from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import LoraConfig, ModelConfig, PolicyConfig
from agentrt.algos.rae import RAEState
from agentrt.runtime.learner import Learner
from agentrt.runtime.steps import advantages_from
from agentrt.core.errors import ModelLoadError
from agentrt.policies.models import load_model
from agentrt.core.types import Trajectory, Turn, collate

PROMPTS = [f"{a}+{b}=" for a, b in [(1, 2), (13, 40), (7, 77), (50, 5), (99, 1), (3, 3)]]


def make_engine(model_dir, **policy):
    algo = policy.pop("algorithm", AlgorithmConfig())
    policy.setdefault("rollout", {"sampling": SamplingConfig(max_new_tokens=6)})
    cfg = PolicyConfig(model=ModelConfig(path=str(model_dir), **policy.pop("model", {})),
                       algorithm=algo, **policy)
    return Learner(cfg, seed=0)


def advantages(engine, batch):
    """Fills the batch's advantages as a pool's driver does between ``prepare`` and ``update``
    (:func:`agentrt.runtime.steps.advantages_from`; fresh RAE baselines)."""
    return advantages_from(batch, engine.algo, engine.kl_coef, RAEState.for_algorithm(engine.algo))


def rollout_batch(engine, group=4, rewards=None):
    tok = engine.tokenizer
    prompts = [[tok.bos_token_id] + tok.encode(p) for p in PROMPTS for _ in range(group)]
    comps = engine.generate(prompts)
    trajs = [Trajectory([Turn(p, c.response_ids, c.logprobs,
                              reward=float(rewards[i]) if rewards is not None else float(i % 3))],
                        group_id=str(i // group))
             for i, (p, c) in enumerate(zip(prompts, comps))]
    return collate(trajs, engine.pad_id), comps


def test_collate_pads_the_turns_into_the_batch_tensors():
    """Right padding, the loss on generated ids only (never the first token), the rollout's
    log-probs as float32 and each turn's reward at its last generated token."""
    two_turns = Trajectory([Turn([1, 2], [3, 4], [-0.1, -0.2], reward=1.5),
                            Turn([1, 2, 3, 4, 5], [6], [-0.3], reward=-2.0)], group_id="a")
    one = Trajectory([Turn([7], [8, 9], [-1 / 3, 0.0], reward=0.25)], group_id="b")
    batch = collate([two_turns, one], pad_id=-1)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 6], [7, 8, 9, -1, -1, -1]]
    assert batch.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1, 0, 1], [0, 1, 1, 0, 0, 0]]
    want = torch.tensor([[0, 0, -0.1, -0.2, 0, -0.3], [0, -1 / 3, 0, 0, 0, 0]])
    assert batch.old_logprobs.dtype == torch.float32 and torch.equal(batch.old_logprobs, want)
    assert batch.token_rewards.tolist() == [[0, 0, 0, 1.5, 0, -2.0], [0, 0, 0.25, 0, 0, 0]]
    assert batch.seq_rewards.tolist() == [-0.5, 0.25] and batch.group_ids == ["a", "b"]


def params_of(engine):
    return {k: v.detach().clone() for k, v in engine.model.named_parameters()}


@pytest.mark.parametrize("lora,old", [(False, "recompute"), (True, "recompute"), (True, "auto")])
def test_rollout_logprobs_match_recomputed(tiny_model_dir, lora, old):
    """The gap is measured by the separate recompute, or (auto, one step per batch) by the
    update's own forward before its step."""
    sampling = SamplingConfig(temperature=0.7, max_new_tokens=6)
    eng = make_engine(tiny_model_dir, lora=LoraConfig(enabled=lora), rollout={"sampling": sampling},
                      algorithm=AlgorithmConfig(old_logprobs=old))
    batch, comps = rollout_batch(eng)
    assert any(not c.finished for c in comps) or all(c.response_ids[-1] == eng.eos_id
                                                     for c in comps)
    metrics = eng.prepare(batch)
    assert ("rollout/logprob_diff" in metrics) == (old == "recompute")
    metrics |= advantages(eng, batch) | eng.update(batch)
    # Left-padded cached generation vs right-padded full forward: same math, float32 rounding.
    assert 0.0 < metrics["rollout/logprob_diff"] < 1e-5


def test_old_logprobs_from_the_update_give_the_recomputed_step(tiny_model_dir):
    """One update per batch: taking the old log-probs from the update's own forward (no
    recompute) gives bit for bit the weights of the step with the separate recompute."""
    engines = [make_engine(tiny_model_dir, optim={"lr": 1e-2},
                           algorithm=AlgorithmConfig(old_logprobs=old))
               for old in ("recompute", "auto")]
    batch, _ = rollout_batch(engines[0])
    batch.old_logprobs = batch.old_logprobs + 0.05 * batch.loss_mask  # rollout numerics off
    params, metrics = [], []
    for eng in engines:
        b = batch.select(list(range(batch.size)))
        metrics.append(eng.prepare(b) | advantages(eng, b) | eng.update(b))
        params.append(params_of(eng))
    assert [e.old_logprobs_source(batch) for e in engines] == ["recompute", "update"]
    assert metrics[0]["actor/grad_norm"] > 0 and metrics[1]["actor/ppo_kl"] == 0.0
    assert all(torch.equal(params[0][k], params[1][k]) for k in params[0])
    for m in metrics:  # the 0.05 offset, seen by the recompute or by the update's forward
        assert m["rollout/logprob_diff"] == pytest.approx(0.05, abs=1e-5)


def test_old_logprobs_are_recomputed_or_the_rollouts_where_the_update_cannot_give_them(
        tiny_model_dir):
    batch, _ = rollout_batch(make_engine(tiny_model_dir))
    bf16 = {"model": {"dtype": "bf16"}}
    cases = {"recompute": [({}, AlgorithmConfig(train_dropout=True)),
                           ({}, AlgorithmConfig(ppo_epochs=2, train_dropout=True)),
                           (bf16, AlgorithmConfig(ppo_epochs=2)),
                           (bf16, AlgorithmConfig(kl={"coef": 0.1, "placement": "reward"})),
                           ({}, AlgorithmConfig(mini_batches=2, old_logprobs="recompute"))],
             "update": [({}, AlgorithmConfig(kl={"coef": 0.1})), (bf16, AlgorithmConfig())],
             # fp32 HF rollout: its log-probs are the trainer's, no second forward pass
             "rollout": [({}, AlgorithmConfig(ppo_epochs=2)), ({}, AlgorithmConfig(mini_batches=2)),
                         ({}, AlgorithmConfig(kl={"coef": 0.1, "placement": "reward"})),
                         ({}, AlgorithmConfig(ppo_epochs=2, old_logprobs="rollout"))]}
    for want, arms in cases.items():
        for policy, algo in arms:
            eng = make_engine(tiny_model_dir, algorithm=algo, **policy)
            assert eng.old_logprobs_source(batch) == want, (policy, algo)
    several = make_engine(tiny_model_dir, algorithm=AlgorithmConfig(mini_batches=2))
    batch.replayed = True  # replayed feedback: rollout log-probs of older weights, recomputed
    assert several.old_logprobs_source(batch.select([0, 1])) == "recompute"
    batch.replayed = False
    batch.stale = True  # async rollout: only the behaviour log-probs are right
    assert make_engine(tiny_model_dir).old_logprobs_source(batch) == "rollout"
    assert make_engine(tiny_model_dir, algorithm=AlgorithmConfig(ppo_epochs=2), **bf16
                       ).old_logprobs_source(batch.select([0, 1])) == "rollout"


def test_rollout_old_logprobs_give_the_recomputed_steps_and_a_gap_turns_them_off(
        tiny_model_dir):
    """Several optimizer steps per batch on an fp32 HF rollout: the rollout's log-probs as the
    old ones give the weights of the separate recompute (fp32 rounding of the ratio); rollout
    log-probs off by 0.05 a token are seen at the update's first step, and the next batch is
    recomputed."""
    algo = AlgorithmConfig(mini_batches=2, ppo_epochs=2)
    engines = [make_engine(tiny_model_dir, optim={"lr": 1e-3},
                           algorithm=algo.model_copy(update={"old_logprobs": old}))
               for old in ("recompute", "auto")]
    start = params_of(engines[0])
    batch, _ = rollout_batch(engines[0])
    params, metrics = [], []
    for eng in engines:
        b = batch.select(list(range(batch.size)))
        metrics.append(eng.prepare(b) | advantages(eng, b) | eng.update(b))
        params.append(params_of(eng))
    assert [e.old_logprobs_source(batch) for e in engines] == ["recompute", "rollout"]
    assert all(0.0 < m["rollout/logprob_diff"] < 1e-5 for m in metrics)
    assert metrics[1]["actor/grad_norm"] == pytest.approx(metrics[0]["actor/grad_norm"], rel=1e-5)
    assert metrics[1]["actor/clipfrac"] == metrics[0]["actor/clipfrac"] > 0
    # Adam turns 1e-7 differences of near-zero gradients into visible steps: compare the whole
    # update, measured 1e-4 of its size (old log-probs 0.01 a token off: 9e-2)
    norm = lambda d: float(sum((v ** 2).sum() for v in d.values()) ** 0.5)  # noqa: E731
    moved = norm({k: params[0][k] - start[k] for k in start})
    assert norm({k: params[0][k] - params[1][k] for k in start}) < 1e-3 * moved
    auto = engines[1]
    off, _ = rollout_batch(auto)
    off.old_logprobs = off.old_logprobs + 0.05 * off.loss_mask  # the rollout's numerics drift
    gap = auto.prepare(off) | advantages(auto, off) | auto.update(off)
    assert gap["rollout/logprob_diff"] == pytest.approx(0.05, abs=1e-4)
    assert auto.old_logprobs_source(off) == "recompute"


def test_greedy_generation_is_deterministic_and_respects_length(tiny_model_dir):
    eng = make_engine(tiny_model_dir)
    prompt = [[1] + eng.tokenizer.encode("12+3=")]
    a = eng.generate(prompt * 3, SamplingConfig(temperature=0.0, max_new_tokens=5))
    assert a[0].response_ids == a[1].response_ids == a[2].response_ids
    assert len(a[0].response_ids) <= 5


def test_lora_reference_is_the_base_with_adapter_disabled(tiny_model_dir):
    algo = AlgorithmConfig(kl={"coef": 0.1})
    eng = make_engine(tiny_model_dir, lora=LoraConfig(enabled=True), algorithm=algo,
                      optim={"lr": 1e-2})
    assert eng.reference.name is None
    base_before = {k: v.clone() for k, v in eng.model.named_parameters() if "lora" not in k}
    batch, _ = rollout_batch(eng)
    eng.prepare(batch)
    torch.testing.assert_close(batch.ref_logprobs, eng.logprobs(batch))  # LoRA B starts at 0
    advantages(eng, batch)
    m = eng.update(batch)
    assert m["actor/kl"] == pytest.approx(0.0, abs=1e-6) and m["actor/skipped"] == 0
    for k, v in eng.model.named_parameters():
        if "lora" not in k:
            assert torch.equal(v, base_before[k]), f"base weight {k} changed under LoRA"
    eng.prepare(batch)
    assert not torch.allclose(batch.ref_logprobs, eng.logprobs(batch))


def test_full_weight_reference_stays_frozen(tiny_model_dir):
    eng = make_engine(tiny_model_dir, algorithm=AlgorithmConfig(kl={"coef": 0.05}),
                      optim={"lr": 1e-2})
    batch, _ = rollout_batch(eng)
    eng.prepare(batch)
    ref_before = batch.ref_logprobs.clone()
    advantages(eng, batch)
    eng.update(batch)
    eng.prepare(batch)
    torch.testing.assert_close(batch.ref_logprobs, ref_before)
    assert not torch.allclose(eng.logprobs(batch), ref_before)


def test_micro_batches_accumulate_to_the_full_batch_gradient(tiny_model_dir):
    engines = [make_engine(tiny_model_dir, micro_batch_size=mbs) for mbs in (5, 64)]
    batch, _ = rollout_batch(engines[0])
    steps = []
    for eng in engines:
        b = batch.select(list(range(batch.size)))
        eng.prepare(b)
        advantages(eng, b)
        params = [p for p in eng.model.parameters()]
        loss_fn = functools.partial(eng.actor_loss, old_from_update=True)  # as update does
        eng.optimize(b, loss_fn, torch.optim.SGD(params, lr=0.0), params, "actor")
        # the accumulated (clipped) gradient: a weight step would round to the weights' ulp
        steps.append(torch.cat([p.grad.flatten() for p in params]))
    assert steps[1].abs().max() > 0
    assert (steps[0] - steps[1]).abs().max() <= 1e-6 * steps[1].abs().max()


def test_bf16_autocast_trains(tiny_model_dir):
    eng = make_engine(tiny_model_dir, model={"dtype": "bf16"}, optim={"lr": 1e-3})
    before = params_of(eng)
    batch, _ = rollout_batch(eng)
    eng.prepare(batch)
    advantages(eng, batch)
    m = eng.update(batch)
    assert m["actor/skipped"] == 0 and torch.isfinite(torch.tensor(m["actor/grad_norm"]))
    after = params_of(eng)
    assert all(after[k].dtype == torch.float32 for k in after)  # fp32 master weights
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_ppo_critic_learns_the_returns(tiny_model_dir):
    algo = AlgorithmConfig(name="ppo", critic_lr=1e-2, ppo_epochs=4)
    eng = make_engine(tiny_model_dir, algorithm=algo)
    batch, _ = rollout_batch(eng, rewards=[1.0] * 24)
    losses = []
    for _ in range(4):
        eng.prepare(batch)
        advantages(eng, batch)
        losses.append(eng.update(batch)["critic/vf_loss"])
    assert losses[-1] < 0.5 * losses[0]


def test_non_finite_loss_skips_the_step(tiny_model_dir):
    eng = make_engine(tiny_model_dir)
    batch, _ = rollout_batch(eng)
    eng.prepare(batch)
    advantages(eng, batch)
    batch.advantages = batch.advantages * float("nan")
    before = params_of(eng)
    m = eng.update(batch)
    assert m["actor/skipped"] == 1.0 and eng.skipped_steps == 1
    after = params_of(eng)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert eng.version == 1  # the step is counted, its update dropped


def test_state_dict_round_trip(tiny_model_dir):
    a = make_engine(tiny_model_dir, lora=LoraConfig(enabled=True), optim={"lr": 1e-2})
    batch, _ = rollout_batch(a)
    a.prepare(batch)
    advantages(a, batch)
    a.update(batch)
    b = make_engine(tiny_model_dir, lora=LoraConfig(enabled=True), optim={"lr": 1e-2})
    b.load_state_dict(a.state_dict())
    assert b.version == 1
    pa, pb = params_of(a), params_of(b)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_missing_model_folder_is_one_clear_line(tmp_path):
    with pytest.raises(ModelLoadError) as exc:
        load_model(tmp_path / "nope")
    assert "does not exist" in str(exc.value) and "\n" not in str(exc.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path / "empty")


def test_factory_model_loads_with_auto_classes(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = model.config
    assert cfg.model_type == "llama"
    assert cfg.hidden_size // cfg.num_attention_heads >= 64  # servable by vLLM
    text = "7*8=56 — ünïcode ok"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_loss_metrics_do_not_depend_on_the_micro_batch_size(tiny_model_dir):
    algo = AlgorithmConfig(kl={"coef": 0.05})
    engines = [make_engine(tiny_model_dir, micro_batch_size=mbs, algorithm=algo)
               for mbs in (4, 64)]
    batch, _ = rollout_batch(engines[0])
    out = []
    for eng in engines:
        b = batch.select(list(range(batch.size)))
        eng.prepare(b)
        advantages(eng, b)
        out.append(eng.update(b))
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl", "actor/loss"):
        assert out[0][key] == pytest.approx(out[1][key], rel=1e-4, abs=1e-7), key


def test_reference_rebased_after_warm_start_survives_a_checkpoint(tiny_model_dir):
    eng = make_engine(tiny_model_dir, algorithm=AlgorithmConfig(kl={"coef": 0.1}),
                      optim={"lr": 1e-2})
    batch, _ = rollout_batch(eng)
    eng.prepare(batch)
    advantages(eng, batch)
    eng.update(batch)  # stands in for a warm start
    eng.reference.rebase()
    eng.prepare(batch)
    torch.testing.assert_close(batch.ref_logprobs, eng.logprobs(batch))  # ref == current policy
    other = make_engine(tiny_model_dir, algorithm=AlgorithmConfig(kl={"coef": 0.1}))
    other.load_state_dict(eng.state_dict())
    other.prepare(batch)
    torch.testing.assert_close(batch.ref_logprobs, other.logprobs(batch))


def test_a_moving_reference_is_rebased_every_n_updates(tiny_model_dir):
    eng = make_engine(tiny_model_dir, algorithm=AlgorithmConfig(kl={"coef": 0.1,
                                                                    "rebase_every": 2}),
                      optim={"lr": 1e-2})
    batch, _ = rollout_batch(eng)
    eng.prepare(batch)
    start = batch.ref_logprobs.clone()
    for version in (1, 2, 3):
        advantages(eng, batch)
        eng.update(batch)
        eng.prepare(batch)
        if version == 1:  # not yet: the start is still the reference
            torch.testing.assert_close(batch.ref_logprobs, start)
        if version == 2:  # rebased after the second update: the reference is the policy
            torch.testing.assert_close(batch.ref_logprobs, eng.logprobs(batch))
            at_two = batch.ref_logprobs.clone()
    torch.testing.assert_close(batch.ref_logprobs, at_two)  # kept through update 3
    assert not torch.allclose(eng.logprobs(batch), at_two)
    other = make_engine(tiny_model_dir, algorithm=AlgorithmConfig(kl={"coef": 0.1,
                                                                      "rebase_every": 2}))
    other.load_state_dict(eng.state_dict())  # a checkpoint carries the moved reference
    other.prepare(batch)
    torch.testing.assert_close(batch.ref_logprobs, at_two)


def test_a_mixed_reference_moves_part_of_the_way_to_the_policy(tiny_model_dir):
    """``rebase_mix`` (TRL's ref_model_mixup_alpha): after each rebase the reference is
    mix * policy + (1 - mix) * reference, and a checkpoint carries it."""
    algo = AlgorithmConfig(kl={"coef": 0.1, "rebase_every": 1, "rebase_mix": 0.25})
    eng = make_engine(tiny_model_dir, algorithm=algo, optim={"lr": 1e-2})
    ref_name = eng.reference.name
    before = eng.shared.weights(ref_name)
    batch, _ = rollout_batch(eng)
    eng.prepare(batch)
    advantages(eng, batch)
    eng.update(batch)
    now, ref = eng.shared.weights(eng.policy_id), eng.shared.weights(ref_name)
    moved = [k for k in ref if not torch.equal(now[k], before[k])]
    assert moved  # the update changed weights, so the reference has somewhere to go
    for k in ref:
        torch.testing.assert_close(ref[k], before[k] + 0.25 * (now[k] - before[k]))
    eng.prepare(batch)
    assert not torch.allclose(batch.ref_logprobs, eng.logprobs(batch))  # not the policy
    other = make_engine(tiny_model_dir, algorithm=algo)
    other.load_state_dict(eng.state_dict())
    for k, v in other.shared.weights(other.reference.name).items():
        torch.testing.assert_close(v, ref[k])


@pytest.mark.parametrize("kl, lora, field", [
    ({"coef": 0.1, "rebase_mix": 0.5}, False, "rebase_mix: mixing happens at each rebase"),
    ({"coef": 0.1, "rebase_every": 1, "rebase_mix": 0.5}, True, "algorithm.kl.rebase_mix: a mix"),
    ({"rebase_every": 10}, "dpo", "kl.rebase_every: a moving reference follows RL updates"),
])
def test_a_moving_reference_is_refused_where_it_would_be_ignored_or_wrong(tiny_model_dir, kl,
                                                                          lora, field):
    """Without rebases a mix never happens; LoRA factors do not mix linearly; a preference
    loss never rebases (its reference log-probs are fixed), so each is one line naming it."""
    from pydantic import ValidationError

    algo = {"name": lora, "kl": kl} if lora == "dpo" else {"kl": kl}
    with pytest.raises(ValidationError, match=field):
        PolicyConfig(model=ModelConfig(path=str(tiny_model_dir)),
                     lora=LoraConfig(enabled=lora is True), algorithm=AlgorithmConfig(**algo))


@pytest.mark.parametrize("train_dropout", [False, True])
def test_lora_dropout_is_off_in_rl_updates_so_the_first_ratio_is_one(tiny_model_dir,
                                                                     train_dropout):
    """Old log-probs are computed without dropout; the update must see the same function, as
    TRL's disable_dropout does (with it on, the log-prob gap reached 0.4 at LoRA dropout 0.1).
    Without train_dropout the ratio's old log-probs are the rollout's (``old_logprobs:
    rollout``): recomputed from the update's own forward pass they would match it whatever
    the dropout, and the check could not fail."""
    algo = AlgorithmConfig(train_dropout=train_dropout,
                           old_logprobs="recompute" if train_dropout else "rollout")
    eng = make_engine(tiny_model_dir, lora=LoraConfig(enabled=True, dropout=0.3),
                      algorithm=algo, optim={"lr": 1e-2})
    with torch.no_grad():  # a trained adapter: B = 0 would hide the dropout on its path
        for name, p in eng.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    batch, _ = rollout_batch(eng)
    eng.prepare(batch)
    advantages(eng, batch)
    m = eng.update(batch)  # one mini-batch, one epoch: the ratio of its only step
    if train_dropout:
        assert abs(m["actor/ppo_kl"]) > 1e-3
    else:
        assert m["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)
        assert m["actor/clipfrac"] == 0.0


def test_warm_start_end_rebases_the_critic_on_the_warm_started_body(tiny_model_dir):
    from agentrt.config.sections import SFTConfig
    from agentrt.runtime.worker import PolicyWorker

    cfg = PolicyConfig(model=ModelConfig(path=str(tiny_model_dir)),
                       algorithm=AlgorithmConfig(name="ppo"),
                       rollout={"sampling": SamplingConfig(max_new_tokens=4)})
    worker = PolicyWorker([cfg])
    eng = worker.learners[cfg.id]
    batch, _ = rollout_batch(eng)
    worker.sft_step(batch, SFTConfig(steps=1, lr=1e-2))
    body = dict(eng.critic.body.named_parameters())
    assert any(not torch.equal(p, body[k]) for k, p in eng.model.model.named_parameters())
    worker.end_sft()
    body = dict(eng.critic.body.named_parameters())
    assert all(torch.equal(p, body[k]) for k, p in eng.model.model.named_parameters())


def test_adapters_added_later_start_with_dropout_off(tiny_model_dir):
    """peft builds a new adapter's modules in training mode: a KL reference made after the
    start (rebased), a league snapshot and a second LoRA policy each carried LoRA dropout 0.3
    into their forward passes, so the reference's log-probs were random and a snapshot's greedy
    play changed between calls (issue 41). Every module stays in eval mode after each, and the
    reference equals the policy it was taken from."""
    lora = LoraConfig(enabled=True, dropout=0.3)
    eng = make_engine(tiny_model_dir, lora=lora,
                      algorithm=AlgorithmConfig(kl={"coef": 0.1, "rebase_every": 1}))
    with torch.no_grad():  # a trained adapter: B = 0 would hide the dropout on its path
        for name, p in eng.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    shared = eng.shared
    shared.freeze(eng.policy_id, "snap")
    shared.add_policy(PolicyConfig(id="second", model=ModelConfig(path=str(tiny_model_dir)),
                                   lora=lora), seed=1)
    eng.reference.rebase()
    assert not [n for n, m in shared.model.named_modules() if m.training]
    batch, _ = rollout_batch(eng)
    policy = eng.logprobs(batch)
    torch.testing.assert_close(eng.logprobs(batch, reference=True), policy, rtol=0, atol=1e-6)
    snap = [eng.passes.logprobs(batch, "snap") for _ in range(2)]
    torch.testing.assert_close(snap[0], snap[1], rtol=0, atol=0)
    torch.testing.assert_close(snap[0], policy, rtol=0, atol=1e-6)
