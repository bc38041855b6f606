"""policy.model.attention: the matmul kernel computes what SDPA computes, on every layout."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agentrt.runtime import attention
from agentrt.algos.config import AlgorithmConfig
from test_engine import make_engine
from test_packing import ARMS, update_steps, varied_batch


def test_matmul_attention_equals_sdpa_with_masks_and_grouped_heads():
    torch.manual_seed(0)
    q = torch.randn(3, 4, 5, 8, requires_grad=True)
    k = torch.randn(3, 2, 7, 8, requires_grad=True)  # 2 kv heads serve 4 query heads
    v = torch.randn(3, 2, 7, 8, requires_grad=True)
    mask = torch.rand(3, 1, 5, 7) > 0.3
    mask[..., 0] = True  # no row without a key
    layer = torch.nn.Linear(1, 1).eval()
    for m in (mask, None):
        out, probs = attention.matmul_attention(layer, q, k, v, m, scaling=0.3)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3, enable_gqa=True)
        torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-6, rtol=1e-5)
        assert probs.shape == (3, 4, 5, 7)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        refs = torch.autograd.grad(ref.transpose(1, 2).square().sum(), (q, k, v))
        for g, r in zip(grads, refs):
            torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)
    # an additive float mask (transformers' eager masks) means the same as the boolean one
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    torch.testing.assert_close(attention.matmul_attention(layer, q, k, v, additive)[0],
                               attention.matmul_attention(layer, q, k, v, mask)[0])


@pytest.mark.parametrize("dtype,device,setting,want", [
    ("bf16", "cpu", "auto", attention.MATMUL), ("fp32", "cpu", "auto", None),
    ("bf16", "cuda", "auto", None), ("fp32", "cpu", "matmul", attention.MATMUL),
    ("bf16", "cpu", "sdpa", None)])
def test_auto_picks_matmul_for_bf16_on_cpu_only(dtype, device, setting, want):
    assert attention.resolve(setting, torch.device(device), dtype == "bf16") == want


def test_the_engine_runs_the_setting(tiny_model_dir, monkeypatch):
    calls = []
    kernel = attention.matmul_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(attention, "matmul_attention", counted)
    bf16 = make_engine(tiny_model_dir, model={"dtype": "bf16"})
    assert bf16.model.config._attn_implementation == attention.MATMUL
    bf16.logprobs(varied_batch(bf16.pad_id, n=4))
    assert calls
    assert make_engine(tiny_model_dir).model.config._attn_implementation == "sdpa"
    assert make_engine(tiny_model_dir, model={"dtype": "bf16", "attention": "sdpa"}
                       ).model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("arm", ["padded", "packed", "shared"])
def test_matmul_logprobs_and_update_equal_sdpa_on_every_layout(tiny_model_dir, arm):
    # AdamW with eps 1: the first step is ~lr * g, so the weights compare the gradients
    optim = {"lr": 1.0, "eps": 1.0}
    algo = AlgorithmConfig(entropy_coef=0.01)
    engines = {kind: make_engine(tiny_model_dir, algorithm=algo, optim=optim,
                                 model={"attention": kind}, **ARMS[arm])
               for kind in ("sdpa", "matmul")}
    assert engines["matmul"].model.config._attn_implementation == attention.MATMUL
    batch = varied_batch(engines["sdpa"].pad_id, n=16, seed=1)
    lp = {kind: eng.logprobs(batch) for kind, eng in engines.items()}
    assert lp["sdpa"].abs().sum() > 0
    torch.testing.assert_close(lp["matmul"], lp["sdpa"], atol=2e-5, rtol=0)
    steps, metrics = update_steps(engines, batch)
    scale = float(steps["sdpa"].abs().max())
    assert scale > 1e-4
    assert float((steps["matmul"] - steps["sdpa"]).abs().max()) <= 1e-4 * scale
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert metrics["matmul"][key] == pytest.approx(metrics["sdpa"][key], rel=1e-4, abs=1e-7)


def test_hf_generate_runs_the_matmul_kernel_with_its_cache(tiny_model_dir):
    greedy = {"sampling": {"temperature": 0.0, "max_new_tokens": 8}, "decode": "hf"}
    out = {}
    for kind in ("sdpa", "matmul"):
        eng = make_engine(tiny_model_dir, model={"attention": kind}, rollout=greedy)
        prompts = [[eng.tokenizer.bos_token_id] + eng.tokenizer.encode(p)
                   for p in ("12+7=", "3+45=", "1+1=")]
        out[kind] = eng.generate(prompts)
    for a, b in zip(out["sdpa"], out["matmul"]):
        assert a.response_ids == b.response_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs),
                                   atol=1e-5, rtol=0)


def test_bf16_matmul_is_as_close_to_fp32_as_bf16_sdpa(tiny_model_dir):
    fp32 = make_engine(tiny_model_dir)
    batch = varied_batch(fp32.pad_id, n=16, seed=2)
    exact, trained = fp32.logprobs(batch), batch.loss_mask.bool()
    err = {}
    for kind in ("sdpa", "matmul"):
        eng = make_engine(tiny_model_dir, model={"dtype": "bf16", "attention": kind})
        err[kind] = float((eng.logprobs(batch) - exact)[trained].abs().max())
    assert 0 < err["sdpa"] < 0.05
    assert err["matmul"] <= 1.5 * err["sdpa"]
