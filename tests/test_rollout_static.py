"""The static decode loop gives what ``model.generate`` gives: the same greedy tokens, log-probs
that a full forward pass recomputes, the same sampling distribution, the streamer protocol, and
it runs LoRA (peft) models and frozen snapshots swapped in by pointer."""

from __future__ import annotations

import random

import pytest
import torch
from scipy.stats import chi2

from agentrt.config.rollout import RolloutConfig, SamplingConfig
from agentrt.policies.models import build_model, load_model
from agentrt.runtime.rollout.hf import HFRollout
from agentrt.runtime.rollout.static import StaticDecoder
from agentrt.runtime.shared_model import swapped_weights

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir)
    return model.eval(), tokenizer


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Prompts of 1-12 tokens (left padding differs per row); every fourth repeats the first,
    so those rows finish together when their common token is the eos."""
    rng = random.Random(seed)
    out = [[1] + [rng.randrange(3, 259) for _ in range(rng.randrange(0, 12))] for _ in range(n)]
    return [out[0] if i % 4 == 0 else p for i, p in enumerate(out)]


def _pair(model, tokenizer, eos: int | None = None, **kw) -> tuple[HFRollout, HFRollout]:
    """(HF generate, static decoder) over the same module; ``eos`` overrides the tokenizer's."""
    hf = HFRollout(model, tokenizer, GREEDY, decode="hf", **kw)
    static = HFRollout(model, tokenizer, GREEDY, decode="static", **kw)
    assert hf.decoder is None and isinstance(static.decoder, StaticDecoder)
    if eos is not None:
        hf.eos_id = static.eos_id = eos
        static.decoder = StaticDecoder(model, static.pad_id, eos, kw.get("autocast_dtype"))
    return hf, static


def _same(a, b, atol: float) -> None:
    assert [c.response_ids for c in a] == [c.response_ids for c in b]
    assert [c.finished for c in a] == [c.finished for c in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs),
                                   atol=atol, rtol=0)


def test_greedy_tokens_and_eos_equal_generate(tiny):
    model, tokenizer = tiny
    prompts = _prompts(16)
    hf, static = _pair(model, tokenizer)
    _same(hf.generate(prompts), static.generate(prompts), atol=1e-5)
    # An eos that the repeated prompt (4 of 16 rows) emits at its third step: those rows stop
    # there and leave the batch (compaction), the others run on; both paths trim alike.
    eos = hf.generate(prompts[:1])[0].response_ids[2]
    hf, static = _pair(model, tokenizer, eos=eos)
    a, b = hf.generate(prompts), static.generate(prompts)
    _same(a, b, atol=1e-5)
    assert sum(c.finished for c in b) >= 4 and all(
        c.response_ids[-1] == eos for c in b if c.finished)


def test_grouped_query_attention_equals_generate(tmp_path):
    """Two query heads per key/value head (the presets have one; real Llamas have several)."""
    model, tokenizer = load_model(build_model(tmp_path / "gqa", "llama-nano", hidden_size=128,
                                              num_attention_heads=4, num_key_value_heads=2))
    hf, static = _pair(model.eval(), tokenizer)
    prompts = _prompts(8, seed=5)
    _same(hf.generate(prompts), static.generate(prompts), atol=1e-5)


def test_bf16_greedy_equals_generate_under_autocast(tiny):
    model, tokenizer = tiny
    prompts = _prompts(8, seed=1)
    hf, static = _pair(model, tokenizer, autocast_dtype=torch.bfloat16)
    _same(hf.generate(prompts), static.generate(prompts), atol=1e-2)


def _recomputed(model, prompt: list[int], response: list[int], temperature: float,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.inference_mode(), torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None]).squeeze(1)


@pytest.mark.parametrize("dtype,atol", [(None, 1e-4), (torch.bfloat16, 0.05)])
def test_sampled_logprobs_equal_a_full_forward(tiny, dtype, atol):
    model, tokenizer = tiny
    prompts = _prompts(16, seed=2)
    sampling = SamplingConfig(temperature=0.7, top_k=40, top_p=0.9, max_new_tokens=10)
    rollout = HFRollout(model, tokenizer, sampling, decode="static", autocast_dtype=dtype)
    torch.manual_seed(0)
    eos = rollout.generate(prompts)[0].response_ids[2]
    # Again with the third token of row 0 as eos: the same draws up to there, so that row (and
    # the rows sampling it too) stops early, and the others run on after it left the batch.
    rollout.eos_id = eos
    rollout.decoder = StaticDecoder(model, rollout.pad_id, eos, dtype)
    torch.manual_seed(0)
    out = rollout.generate(prompts)
    assert out[0].finished and len(out[0].response_ids) <= 3
    assert any(len(c.response_ids) == sampling.max_new_tokens for c in out)
    for p, c in zip(prompts, out):
        torch.testing.assert_close(torch.tensor(c.logprobs),
                                   _recomputed(model, p, c.response_ids, 0.7, dtype),
                                   atol=atol, rtol=0)


def test_sampling_distribution_matches_transformers_warpers(tmp_path):
    """4,000 first tokens from one prompt against the distribution transformers' own
    temperature/top-k/top-p warpers give (chi-square, p > 0.001), and none outside its support."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    model, tokenizer = load_model(build_model(tmp_path / "nano", "llama-nano", seed=1))
    model.eval()
    with torch.no_grad():  # a peaked distribution (top-p then keeps 24 of top-k's 30 tokens)
        model.lm_head.weight.mul_(3.0)
    prompt, n = [1, 17, 42], 4000
    sampling = SamplingConfig(temperature=0.8, top_k=30, top_p=0.9, max_new_tokens=1)
    with torch.inference_mode():
        scores = model(input_ids=torch.tensor([prompt])).logits[:, -1].float()
    for warper in (TemperatureLogitsWarper(0.8), TopKLogitsWarper(30), TopPLogitsWarper(0.9)):
        scores = warper(None, scores)
    expected = scores.softmax(-1)[0]
    support = expected > 0
    assert 3 <= int(support.sum()) < 30
    rollout = HFRollout(model, tokenizer, sampling, batch_size=n, decode="static")
    torch.manual_seed(0)
    out = rollout.generate([prompt] * n)
    torch.manual_seed(0)
    assert [c.response_ids for c in rollout.generate([prompt] * n)] == [
        c.response_ids for c in out]  # the same seed draws the same tokens
    counts = torch.bincount(torch.tensor([c.response_ids[0] for c in out]),
                            minlength=len(expected)).double()
    assert counts[~support].sum() == 0
    # chi-square over the support, tokens expected fewer than 5 times pooled into one bin
    big, small = support & (n * expected >= 5), support & (n * expected < 5)
    observed = torch.cat([counts[big], counts[small].sum()[None]])
    wanted = n * torch.cat([expected[big], expected[small].sum()[None]]).double()
    observed, wanted = observed[wanted > 0], wanted[wanted > 0]
    stat = float(((observed - wanted) ** 2 / wanted).sum())
    assert stat < chi2.ppf(0.999, len(observed) - 1)


def test_lora_adapters_and_frozen_snapshots(tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    model, tokenizer = load_model(tiny_model_dir)
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj",
                                                                            "down_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # an adapter that changes the output
    model.eval()
    prompts = _prompts(8, seed=3)
    hf, static = _pair(model, tokenizer)
    lora = static.generate(prompts)
    _same(hf.generate(prompts), lora, atol=1e-5)
    with model.disable_adapter():
        base = static.generate(prompts)
        _same(hf.generate(prompts), base, atol=1e-5)
    assert [c.response_ids for c in base] != [c.response_ids for c in lora]
    # A full-weight snapshot swapped in by pointer (how league opponents generate)
    plain, _ = load_model(tiny_model_dir)
    plain.eval()
    snapshot = {k: v + 0.05 * torch.randn_like(v) for k, v in plain.state_dict().items()
                if k.endswith("proj.weight")}
    hf, static = _pair(plain, tokenizer)
    with swapped_weights(plain, snapshot):
        swapped = static.generate(prompts)
        _same(hf.generate(prompts), swapped, atol=1e-5)
    assert [c.response_ids for c in static.generate(prompts)] != [
        c.response_ids for c in swapped]


def _adapters_model(tiny_model_dir, dropout: float = 0.0):
    """llama-tiny with three LoRA adapters of different ranks and targets (random B, so each
    changes the output)."""
    from peft import LoraConfig, get_peft_model

    model, tokenizer = load_model(tiny_model_dir)
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout,
                                             target_modules=["q_proj", "v_proj", "down_proj"]),
                           adapter_name="x")
    model.add_adapter("y", LoraConfig(r=8, lora_alpha=8, lora_dropout=dropout,
                                      target_modules=["q_proj", "k_proj", "o_proj", "gate_proj",
                                                      "up_proj", "down_proj"]))
    model.add_adapter("z", LoraConfig(r=2, lora_alpha=4, lora_dropout=dropout,
                                      target_modules=["v_proj", "up_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model.eval(), tokenizer


def _one_adapter_at_a_time(model, rollout, prompts, names, sampling=GREEDY):
    out = []
    for prompt, name in zip(prompts, names):
        model.set_adapter(name)
        out += rollout.generate([prompt], sampling)
    return out


@pytest.mark.parametrize("decode", ["static", "hf"])
def test_a_mixed_adapter_batch_equals_each_adapter_on_its_own(tiny_model_dir, decode):
    """Rows of three adapters (ranks 4, 8, 2; different target modules) in one batch, interleaved
    and sharing prompts across adapters (the static decoder's shared prefill must not share
    them), give each adapter's own tokens and log-probs; so does a row set whose adapters finish
    at different steps (rows dropped mid-batch)."""
    model, tokenizer = _adapters_model(tiny_model_dir)
    prompts = _prompts(12, seed=5)
    names = ["x", "y", "z", "y", "x", "z", "z", "y", "x", "x", "y", "z"]
    rollout = HFRollout(model, tokenizer, GREEDY, decode=decode)
    alone = _one_adapter_at_a_time(model, rollout, prompts, names)
    model.set_adapter("z")  # the active adapter plays no part in a mixed batch
    mixed = rollout.generate(prompts, GREEDY, adapters=names)
    _same(alone, mixed, atol=1e-5)
    assert len({tuple(c.response_ids) for c, n in zip(alone, names) if n == "x"} &
               {tuple(c.response_ids) for c, n in zip(alone, names) if n == "y"}) < 3
    # An eos the adapters emit at different steps: rows leave the batch while others go on
    eos = mixed[0].response_ids[2]
    hf, static = _pair(model, tokenizer, eos=eos)
    rollout = static if decode == "static" else hf
    _same(_one_adapter_at_a_time(model, rollout, prompts, names),
          rollout.generate(prompts, GREEDY, adapters=names), atol=1e-5)


def test_mixed_adapter_batch_under_bf16_and_with_peft_layers_it_does_not_stack(tiny_model_dir):
    """bf16 autocast: within bf16's tolerance of each adapter alone. LoRA dropout in a module left
    in training mode is peft's own mixed batch (the decoder does not stack those layers)."""
    model, tokenizer = _adapters_model(tiny_model_dir)
    prompts = _prompts(9, seed=6)
    names = ["x", "y", "z"] * 3
    rollout = HFRollout(model, tokenizer, GREEDY, decode="static", autocast_dtype=torch.bfloat16)
    alone = _one_adapter_at_a_time(model, rollout, prompts, names)
    mixed = rollout.generate(prompts, GREEDY, adapters=names)
    torch.testing.assert_close(torch.tensor([x for c in alone for x in c.logprobs[:1]]),
                               torch.tensor([x for c in mixed for x in c.logprobs[:1]]),
                               atol=0.05, rtol=0)
    from agentrt.runtime.rollout.plan import _stacked_lora

    model, tokenizer = _adapters_model(tiny_model_dir, dropout=0.5)
    q_proj = model.base_model.model.model.layers[0].self_attn.q_proj
    assert _stacked_lora(q_proj, ["x", "y"], torch.float32) is not None  # eval: no dropout
    rollout = HFRollout(model.train(), tokenizer, GREEDY, decode="static")
    assert _stacked_lora(q_proj, ["x", "y"], torch.float32) is None
    runs = []
    for _ in range(2):  # peft's mixed batch, dropout drawn from torch's generator
        torch.manual_seed(1)
        runs.append(rollout.generate(prompts, GREEDY, adapters=names))
    _same(*runs, atol=0)
    model.eval()
    _same(_one_adapter_at_a_time(model, rollout, prompts, names),
          rollout.generate(prompts, GREEDY, adapters=names), atol=1e-5)


@pytest.mark.parametrize("dtype,atol", [(None, 1e-5), (torch.bfloat16, 0.05)])
def test_a_full_weight_batch_equals_each_snapshot_swapped_in(tiny_model_dir, dtype, atol):
    """Rows of the live model and of two full-weight snapshots (one of every tensor, one of the
    projections only: the rest is the module's) in one batch, interleaved runs and shared
    prompts, give what each gives swapped in on its own; rows leave the batch mid-way too."""
    model, tokenizer = load_model(tiny_model_dir)
    model.eval()
    torch.manual_seed(4)
    noisy: dict[int, torch.Tensor] = {}  # tied weights (embedding, head): one tensor, one noise
    frozen = {"all": {k: noisy.setdefault(v.data_ptr(), v + 0.05 * torch.randn_like(v))
                      for k, v in model.state_dict().items()},
              "proj": {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()
                       if k.endswith("proj.weight")}}
    prompts = _prompts(12, seed=7)
    names = ["live", "all", "all", "proj", "live", "proj", "all", "live", "live", "proj", "all",
             "proj"]
    rollout = HFRollout(model, tokenizer, GREEDY, decode="static", autocast_dtype=dtype)

    def alone():
        out = []
        for prompt, name in zip(prompts, names):
            with swapped_weights(model, frozen.get(name, {})):
                out += rollout.generate([prompt], GREEDY)
        return out

    one = alone()
    batch = rollout.generate(prompts, GREEDY, adapters=names, frozen=frozen)
    if dtype is None:
        _same(one, batch, atol=atol)
    else:  # bf16: the first token's log-prob within bf16's tolerance
        torch.testing.assert_close(torch.tensor([c.logprobs[0] for c in one]),
                                   torch.tensor([c.logprobs[0] for c in batch]), atol=atol,
                                   rtol=0)
    assert len({tuple(c.response_ids) for c, n in zip(one, names) if n == "live"} &
               {tuple(c.response_ids) for c, n in zip(one, names) if n == "all"}) < 3
    if dtype is None:
        rollout.eos_id = rollout.decoder.eos_id = batch[1].response_ids[3]
        _same(alone(), rollout.generate(prompts, GREEDY, adapters=names, frozen=frozen),
              atol=atol)
    with pytest.raises(ValueError, match="static decoder"):
        HFRollout(model, tokenizer, GREEDY, decode="hf").generate(prompts, GREEDY,
                                                                  adapters=names, frozen=frozen)


class _Recorder:
    def __init__(self) -> None:
        self.puts: list[list] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.tolist())

    def end(self) -> None:
        self.ended = True


def test_streamer_sees_what_generate_streams(tiny):
    model, tokenizer = tiny
    prompts = _prompts(8, seed=4)
    eos = HFRollout(model, tokenizer, GREEDY, decode="hf").generate(prompts[:1])[0].response_ids[1]
    streams = []
    for rollout in _pair(model, tokenizer, eos=eos):
        recorder = _Recorder()
        rollout.generate(prompts, streamer=recorder)
        assert recorder.ended
        streams.append(recorder.puts)
    assert streams[0] == streams[1]
    assert len(streams[0]) == 1 + GREEDY.max_new_tokens  # prompt ids, then one put per step


def test_decode_mode_is_validated_and_falls_back(tmp_path):
    from pydantic import ValidationError
    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(ValidationError, match="decode"):
        RolloutConfig(decode="compiled")
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=259, n_embd=32, n_layer=1, n_head=2,
                                      n_positions=64)).eval()
    _, tokenizer = load_model(build_model(tmp_path / "nano", "llama-nano"))
    with pytest.raises(ValueError, match="rollout.decode is 'static' but model type 'gpt2'"):
        HFRollout(gpt2, tokenizer, GREEDY, decode="static")
    auto = HFRollout(gpt2, tokenizer, GREEDY)
    assert auto.decoder is None
    assert len(auto.generate([[1, 5, 6]])[0].response_ids) == GREEDY.max_new_tokens
