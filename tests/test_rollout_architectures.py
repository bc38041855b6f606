"""The static decoder on every architecture it runs (Mistral, Qwen2, Qwen3, Gemma 2/3, Phi-3 beside
Llama): greedy tokens equal ``model.generate``'s and log-probs equal the model's own forward, with
left-padded prompts of different lengths; each family's differences from Llama (sliding windows,
q/k/v biases, q/k norms, Gemma's norms and soft-capping, Gemma 3's per-layer rotary, Phi-3's fused
projections and partial rotary) set so that they change the tokens; LoRA mixed batches and
full-weight snapshot batches on non-Llama models; the architectures it refuses say why."""

from __future__ import annotations

import random

import pytest
import torch

from agentrt.config.rollout import SamplingConfig
from agentrt.policies.models import build_model, load_model
from agentrt.runtime.rollout.families import describe
from agentrt.runtime.rollout.hf import HFRollout
from agentrt.runtime.rollout.static import StaticDecoder, grouped_unsupported
from agentrt.runtime.shared_model import swapped_weights

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=10)
# Each family's features, set so that prompts of up to 12 tokens plus 10 new ones use them:
# windows of 5 keys, Gemma 2's soft-capping at small caps, Gemma 3's local layers on another
# rotary base than its global ones, Phi-3's rotary over half of each head.
FEATURES = {
    "llama": {},
    "mistral": dict(sliding_window=5),
    "qwen2": dict(use_sliding_window=True, sliding_window=5, max_window_layers=1),
    "qwen3": dict(use_sliding_window=True, sliding_window=5, max_window_layers=1),
    "gemma2": dict(sliding_window=5, attn_logit_softcapping=1.0, final_logit_softcapping=2.0),
    "gemma3": dict(sliding_window=5, layer_types=["sliding_attention", "full_attention"],
                   rope_parameters={"sliding_attention": {"rope_type": "default",
                                                          "rope_theta": 10.0},
                                    "full_attention": {"rope_type": "default",
                                                       "rope_theta": 1e6}}),
    "phi3": dict(sliding_window=5, partial_rotary_factor=0.5),
}


def _model(tmp_path, arch: str, attention: str | None = None):
    model, tokenizer = load_model(build_model(tmp_path / arch, f"{arch}-tiny", seed=3,
                                              **FEATURES[arch]))
    if attention is not None:
        model.set_attn_implementation(attention)
    torch.manual_seed(0)
    with torch.no_grad():  # norms and biases away from their initial 1 / 0, so they count
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(0, 0.3)
            if attention == "eager" and "q_proj" in name:  # scores large enough to be capped
                p.mul_(8.0)
    return model.eval(), tokenizer


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 259) for _ in range(rng.randrange(0, 12))] for _ in range(n)]


def _forward_logprobs(model, prompt: list[int], response: list[int],
                      temperature: float = 1.0) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None]).squeeze(1)


def _same(a, b, atol: float = 1e-5) -> None:
    assert [c.response_ids for c in a] == [c.response_ids for c in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs),
                                   atol=atol, rtol=0)


@pytest.mark.parametrize("arch,attention", [(a, None) for a in FEATURES] + [("gemma2", "eager")])
def test_static_decoder_equals_generate_and_the_forward(tmp_path, arch, attention):
    """Gemma 2 under SDPA (transformers' default) has no attention soft-capping in its forward,
    under eager it has: the decoder follows the model's forward either way."""
    model, tokenizer = _model(tmp_path, arch, attention)
    prompts = _prompts(8, seed=len(arch))
    hf = HFRollout(model, tokenizer, GREEDY, decode="hf")
    static = HFRollout(model, tokenizer, GREEDY, decode="static")
    assert isinstance(static.decoder, StaticDecoder)
    want, got = hf.generate(prompts), static.generate(prompts)
    assert [c.response_ids for c in got] == [c.response_ids for c in want]
    for prompt, c in zip(prompts, got):
        torch.testing.assert_close(torch.tensor(c.logprobs),
                                   _forward_logprobs(model, prompt, c.response_ids),
                                   atol=1e-4, rtol=0)
    sampling = SamplingConfig(temperature=0.8, top_k=50, top_p=0.95, max_new_tokens=8)
    torch.manual_seed(1)
    sampled = static.generate(prompts, sampling)
    for prompt, c in zip(prompts, sampled):
        assert c.response_ids and all(0 <= t < len(tokenizer) for t in c.response_ids)
        assert c.finished == (c.response_ids[-1] == static.eos_id)
        torch.testing.assert_close(torch.tensor(c.logprobs),
                                   _forward_logprobs(model, prompt, c.response_ids, 0.8),
                                   atol=1e-4, rtol=0)


def test_mixed_lora_batch_on_phi3_fused_projections(tmp_path):
    """Two adapters on Phi-3's fused qkv_proj and gate_up_proj in one batch give what each
    gives alone."""
    from peft import LoraConfig, get_peft_model

    base, tokenizer = _model(tmp_path, "phi3")
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=[
        "qkv_proj", "o_proj", "gate_up_proj", "down_proj"]), adapter_name="x")
    model.add_adapter("y", LoraConfig(r=2, lora_alpha=4, target_modules=["qkv_proj",
                                                                         "gate_up_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.eval()
    prompts, names = _prompts(8, seed=2), ["x", "y", "y", "x", "x", "y", "x", "y"]
    rollout = HFRollout(model, tokenizer, GREEDY, decode="static")
    alone = []
    for prompt, name in zip(prompts, names):
        model.set_adapter(name)
        alone += rollout.generate([prompt])
    _same(alone, rollout.generate(prompts, GREEDY, adapters=names))
    assert [c.response_ids for c, n in zip(alone, names) if n == "x"] != [
        c.response_ids for c, n in zip(alone, names) if n == "y"]


def test_full_weight_batch_on_phi3_and_who_refuses_it(tmp_path):
    """Phi-3 (Llama's norms, fused bias-free projections) runs the policy and a snapshot in one
    batch as each alone; families with other norms or biases are refused, so the caller runs
    each snapshot on its own."""
    model, tokenizer = _model(tmp_path, "phi3")
    torch.manual_seed(2)
    frozen = {"snap": {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()
                       if k.endswith("proj.weight")}}
    prompts, names = _prompts(6, seed=3), ["live", "snap", "snap", "live", "snap", "live"]
    rollout = HFRollout(model, tokenizer, GREEDY, decode="static")
    alone = []
    for prompt, name in zip(prompts, names):
        with swapped_weights(model, frozen.get(name, {})):
            alone += rollout.generate([prompt])
    assert grouped_unsupported(model) is None
    _same(alone, rollout.generate(prompts, GREEDY, adapters=names, frozen=frozen))
    for arch, why in (("qwen3", "q/k norms"), ("gemma2", "Gemma"), ("qwen2", "bias")):
        other, _ = _model(tmp_path, arch)
        assert why in grouped_unsupported(other)


@pytest.mark.parametrize("arch,why", [
    ("gpt2", "absolute positions"), ("gpt_neox", "parallel residual")])
def test_unsupported_architectures_say_why_and_fall_back(tmp_path, arch, why):
    model, tokenizer = load_model(build_model(tmp_path / arch, f"{arch}-nano"))
    assert why in describe(model)
    with pytest.raises(ValueError, match=f"rollout.decode is 'static' but model type '{arch}'"):
        HFRollout(model, tokenizer, GREEDY, decode="static")
    auto = HFRollout(model.eval(), tokenizer, GREEDY)
    assert auto.decoder is None and len(auto.generate([[1, 5, 6]])[0].response_ids) > 0
