"""Sampling settings reach the HF rollout as configured: top_k 0 samples the full distribution."""

from __future__ import annotations

import torch

from agentrt.config.rollout import SamplingConfig
from agentrt.policies.models import load_model
from agentrt.runtime.rollout.hf import HFRollout


def _distinct_first_tokens(model_dir, top_k: int, n: int = 2048) -> int:
    """Distinct tokens among ``n`` one-token samples from one prompt (<bos>) at temperature 1."""
    model, tokenizer = load_model(model_dir)
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, top_k=top_k, max_new_tokens=1)
    torch.manual_seed(0)
    out = HFRollout(model, tokenizer, sampling, batch_size=n).generate([[1]] * n)
    return len({c.response_ids[0] for c in out})


def test_hf_top_k_zero_samples_the_full_distribution(tiny_model_dir):
    # The random-init model is close to uniform over its 259 tokens (p from 0.002 to 0.007):
    # 2,048 samples at top_k 0, top_p 1.0 held all 259 (2026-12-03, transformers 5.25). When
    # top_k 0 was passed as None, transformers applied its default top_k=50: exactly 50.
    assert _distinct_first_tokens(tiny_model_dir, top_k=0) > 100
    assert _distinct_first_tokens(tiny_model_dir, top_k=5) <= 5


def test_the_sampled_cdf_keeps_the_tail_of_a_large_vocabulary():
    """Issue 41: a 128k-token Zipf distribution (an LM's long tail): the interval each token
    gets in the CDF the sampler inverts equals its probability (total variation < 1e-9 where
    the float32 sum lost 8.5e-4, its last tokens' intervals empty), and the draws follow it."""
    from agentrt.runtime.rollout.static import sample, sampling_cdf

    vocab = 131_072
    probs = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64) ** 1.2
    probs = (probs / probs.sum()).to(torch.float32).unsqueeze(0)  # as softmax returns them
    cdf = sampling_cdf(probs)[0]
    widths = torch.diff(cdf, prepend=cdf.new_zeros(1)) / cdf[-1]
    want = probs[0].double() / probs[0].double().sum()
    assert 0.5 * (widths - want).abs().sum() < 1e-9
    assert bool((widths[-1000:] > 0).all())  # every tail token can be drawn
    torch.manual_seed(0)
    draws = torch.cat([sample(probs.expand(1024, -1)) for _ in range(4)])
    assert draws.min() >= 0 and draws.max() < vocab
    top = float((draws == 0).double().mean())
    assert abs(top - float(want[0])) < 4 * (float(want[0]) * (1 - float(want[0])) / 4096) ** 0.5
