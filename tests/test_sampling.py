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
