"""The attention kernel of the trainer's forward passes (``policy.model.attention``).

Transformers runs a Llama's attention through SDPA by default. On a CPU under bf16 autocast,
SDPA's flash kernel has a slow backward: in a GRPO update of llama-tiny (256 sequences of ~40
tokens, packed with shared prompts) it took 42 ms per layer against 3 ms for its forward, half of
the update. Plain matmuls (scores, softmax, weighted values: what transformers' "eager" attention
computes) are bf16 GEMMs the CPU's AMX units run fast, and their backward is two more: the same
compiled update took 0.11-0.13 s against 0.18-0.21 (docs/performance.md). In fp32 the two were
equal, and on CUDA flash attention is the fast path, so ``auto`` picks matmul for bf16 on CPU only.

The matmul kernel is registered with transformers' ``AttentionInterface`` under :data:`MATMUL`,
with a boolean mask (transformers' SDPA mask, never skipped for causal), so the 4D masks of
packed rows and shared prompts (:mod:`agentrt.runtime.packing`) apply as they do under SDPA. The softmax
runs in fp32, as in transformers' eager attention.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

MATMUL = "agentrt_matmul"


def matmul_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, attention_mask: torch.Tensor | None,
                     scaling: float | None = None, dropout: float = 0.0, **kwargs: Any
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention as matmuls. ``query`` [b, heads, q, d], ``key``/``value`` [b, kv heads, k, d],
    ``attention_mask`` [b, 1, q, >= k] (bool, True: may attend; or additive floats) or None
    (everything attends). Returns the output [b, q, heads, d] and the probabilities."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each kv head serves ``groups`` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        mask = attention_mask[..., :key.shape[-2]]
        scores = (scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
                  if mask.dtype == torch.bool else scores + mask)
    probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def _bool_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """Transformers' SDPA mask (boolean), with the causal mask always built: the matmul kernel
    has no ``is_causal`` of its own."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def register() -> None:
    """Makes :data:`MATMUL` a name transformers' models accept as their attention."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(MATMUL, matmul_attention)
    AttentionMaskInterface.register(MATMUL, _bool_mask)


def resolve(setting: str, device: torch.device, bf16: bool) -> str | None:
    """The attention implementation to set for ``policy.model.attention`` (None: keep the
    model's own)."""
    if setting == "matmul" or (setting == "auto" and bf16 and device.type == "cpu"):
        return MATMUL
    return None


def apply(model: nn.Module, setting: str, device: torch.device, bf16: bool) -> None:
    """Sets ``model``'s attention per ``policy.model.attention`` (a no-op when it keeps its own
    or has no transformers attention to set)."""
    name = resolve(setting, device, bf16)
    if name is None or not hasattr(model, "set_attn_implementation"):
        return
    register()
    model.set_attn_implementation(name)
