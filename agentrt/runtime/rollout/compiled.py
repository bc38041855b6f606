"""The static decoder's decode step through torch.compile (``policy.compile``).

An eager decode step of a small model is mostly not matmuls: per layer two RMSNorms, the rotary
embedding, the cache writes, attention over the cache, the residual adds and SiLU-times-up are
each one or more kernels. Compiled (inductor, the batch and the cache length dynamic), the step
is its matmuls plus a few fused loops: on CPU the matmuls are oneDNN's over the call's packed
weights (:mod:`agentrt.runtime.rollout.packed`) and attention is the C++ kernel of
:mod:`agentrt.runtime.rollout.kernels` (where it could not be built, two fused reductions, scores then
the weighted sum of values, with fp32 accumulators). llama-small, 256 rows, 32 new tokens, on an
AMD EPYC: 440-465 GFLOP/s bf16, 275 fp32 (docs/performance.md).

It runs the plain plan only: one model's own weights (no mixed LoRA adapters, no full-weight
snapshots), every projection a bias-free ``nn.Linear``; other batches run the eager step. The
math is the eager step's up to the order of floating-point sums: autocast's bf16 matmuls, fp32
RMSNorm statistics, queries rounded to the cache's dtype as SDPA under autocast does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx.experimental._config as fx_config
import torch.nn.functional as F
from torch import nn

from agentrt.runtime.rollout import kernels, packed
from agentrt.runtime.rollout.plan import rms_norm


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _step_fn(inner: nn.Module, n_heads: int, n_kv: int, head_dim: int) -> Any:
    """The decode step of ``inner`` (a LlamaModel) as a function of tensors only; on CPU its
    projections run through the call's packed weights (:func:`packed.packed_linear`)."""
    cpu = inner.embed_tokens.weight.device.type == "cpu"
    op = packed.packed_linear if cpu else F.linear
    fused = cpu and kernels.available()  # attention over the cache as one C++ kernel

    def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # autocast's cast of the input, in the graph: inductor fuses it into the op that made x
        return op(x.to(weight.dtype), weight)

    eps = inner.norm.variance_epsilon
    scale = inner.layers[0].self_attn.scaling
    act = inner.layers[0].mlp.act_fn
    groups = n_heads // n_kv

    def step(tokens, cos, sin, embed, norms, qkv, o_proj, gate_up, down, final, head, k_caches,
             v_caches, attend):
        b, s = tokens.shape
        start = attend.shape[-1] - s
        h = F.embedding(tokens, embed)
        qk_width = (n_heads + n_kv) * head_dim
        for i, (k_cache, v_cache) in enumerate(zip(k_caches, v_caches)):
            y = linear(rms_norm(h, norms[2 * i], eps), qkv[i])
            qk = y[..., :qk_width].view(b, s, -1, head_dim).transpose(1, 2)
            qk = qk * cos + rotate_half(qk) * sin
            q, k = qk[:, :n_heads], qk[:, n_heads:]
            k_cache[:, :, start:start + s] = k
            v_cache[:, :, start:start + s] = y[..., qk_width:].view(
                b, s, n_kv, head_dim).transpose(1, 2)
            q = q.to(k_cache.dtype)  # [b, heads, s, d]; as SDPA sees it under autocast
            if fused:
                o = kernels.cache_attention(q, k_cache, v_cache, attend, scale)
            else:
                keys = k_cache[:, :, :start + s].repeat_interleave(groups, 1).float()
                values = v_cache[:, :, :start + s].repeat_interleave(groups, 1).float()
                scores = (q.float()[:, :, :, None] * keys[:, :, None]).sum(-1) * scale
                p = scores.masked_fill(~attend, float("-inf")).softmax(-1)  # [b, heads, s, keys]
                o = (p[..., None] * values[:, :, None]).sum(-2).to(k_cache.dtype)
            h = h + linear(o.transpose(1, 2).reshape(b, s, -1), o_proj[i])
            gate, up = linear(rms_norm(h, norms[2 * i + 1], eps), gate_up[i]).chunk(2, dim=-1)
            h = h + linear(act(gate) * up, down[i])
        return linear(rms_norm(h[:, -1], final, eps), head)

    return step


def plain_plan(plan: Any) -> bool:
    """Whether ``plan`` (a :class:`~agentrt.runtime.rollout.static.Plan`) is one model's own weights:
    an ``nn.Embedding``, RMSNorms and bias-free projections concatenated once per call."""
    modules = [plan.embed, plan.norm] + [m for layer in plan.layers for m in (layer[0], layer[3])]
    projections = [plan.head] + [p for layer in plan.layers for p in layer[1:3] + layer[4:]]
    return (type(getattr(plan.embed, "module", None)) is nn.Embedding
            and all(hasattr(getattr(m, "module", None), "variance_epsilon") for m in modules[1:])
            and all(getattr(p, "weight", None) is not None and p.bias is None
                    for p in projections))


class CompiledStep:
    """The decode step of one Llama model through ``torch.compile``: compiled at its first call
    (tens of seconds on CPU), again only for a new dtype, never for a new batch size, prompt
    width or cache length (those dimensions are dynamic, and sizes that happen to be equal are
    not assumed to stay so)."""

    def __init__(self, inner: nn.Module, n_heads: int, n_kv: int, head_dim: int) -> None:
        self.fn = torch.compile(_step_fn(inner, n_heads, n_kv, head_dim))
        self.rotary = inner.rotary_emb

    def bind(self, plan: Any) -> Callable[..., torch.Tensor]:
        """``StaticDecoder._forward`` for a plain ``plan`` (:func:`plain_plan`), its weights
        gathered once for the generate call: ``(plan, caches, tokens, pos, start, attend,
        adapters)`` -> logits of the last position [b, V]; writes the new keys and values at
        ``start`` (``attend.shape[-1] - tokens.shape[1]``)."""
        layers = plan.layers
        packs = {p.weight.data_ptr(): p.packed for p in [plan.head]
                 + [layer[i] for layer in layers for i in (1, 2, 4, 5)] if p.packed is not None}
        weights = (plan.embed.module.weight,
                   [layer[i].module.weight for layer in layers for i in (0, 3)],
                   [layer[1].weight for layer in layers], [layer[2].weight for layer in layers],
                   [layer[4].weight for layer in layers], [layer[5].weight for layer in layers],
                   plan.norm.module.weight, plan.head.weight)

        def forward(_plan: Any, caches: list[tuple[torch.Tensor, torch.Tensor]],
                    tokens: torch.Tensor, pos: torch.Tensor, _start: int, attend: torch.Tensor,
                    _adapters: None = None) -> torch.Tensor:
            k_caches, v_caches = [k for k, _ in caches], [v for _, v in caches]
            # The rotary angles outside the graph: inside, inductor inlines their cos and sin
            # into the loop over the cache's keys and evaluates them once per key. (The
            # embedding weight gives them its dtype, that of the eager step's hidden states.)
            cos, sin = (x.unsqueeze(1) for x in self.rotary(weights[0], pos))
            for x in (tokens, cos, sin, attend, *k_caches, *v_caches):
                torch._dynamo.maybe_mark_dynamic(x, 0)
            torch._dynamo.maybe_mark_dynamic(attend, 3)
            for x in (*k_caches, *v_caches):
                torch._dynamo.maybe_mark_dynamic(x, 2)
            with fx_config.patch(use_duck_shape=False), packed.using(packs):
                # (use_duck_shape: batch 8 == 8 keys is a coincidence)
                return self.fn(tokens, cos, sin, *weights, k_caches, v_caches, attend)

        return forward
