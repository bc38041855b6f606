"""What the static decoder needs to know of a model family's decoder layer, read from its modules.

The decoder (:mod:`agentrt.runtime.rollout.static`) runs Llama's layer through the model's own
modules: ``input_layernorm``, the q/k/v projections, rotary embedding, attention over its cache,
``o_proj``, the MLP's norm, gate/up, ``act_fn`` and ``down``. The families it runs differ from
that layer in a few places, each found on the modules, never copied from a family's forward:

- Mistral: Llama's layer; keys farther back than ``config.sliding_window`` are masked.
- Qwen2: biases on q/k/v (:class:`~agentrt.runtime.rollout.plan.Projection` concatenates them);
  sliding-window layers where ``self_attn.sliding_window`` is set.
- Qwen3: per-head ``q_norm``/``k_norm`` before the rotary embedding.
- Phi-3: one fused ``qkv_proj`` and ``gate_up_proj``, ``activation_fn``; a partial rotary
  embedding when its cos/sin are narrower than a head.
- Gemma 2 and 3: the embedding module scales by sqrt(hidden) itself; the attention output and the
  MLP output pass through ``post_attention_layernorm`` / ``post_feedforward_layernorm`` before
  their residual add, the MLP input through ``pre_feedforward_layernorm``; ``self_attn.scaling``
  from ``query_pre_attn_scalar``; per-layer sliding windows; final-logit soft-capping. Gemma 2's
  attention-logit soft-capping where the model's attention kernel applies it (transformers'
  eager, flex and flash kernels do, its SDPA and agentrt's matmul kernel do not: the decoder
  follows the model's own forward, which the trainer's log-probs come from), as an explicit
  attention. Gemma 3's rotary embedding takes the layer's type (local layers: their own base).

Model types outside :data:`FAMILIES` fall back to ``model.generate``: :data:`OTHERS` says why
for the ones the presets name (GPT-2, GPT-NeoX), and any other type is refused rather than run
on a guess about its layer.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from agentrt.runtime.rollout import kernels
from agentrt.runtime.rollout.compiled import rotate_half

# model_type of the families the decoder is tested against (tests/test_rollout_architectures.py)
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3")
OTHERS = {
    "gpt2": "model type 'gpt2' has learned absolute positions, Conv1D projections and "
            "LayerNorm, not the rotary decoder layer the static decoder runs",
    "gpt_neox": "model type 'gpt_neox' has a parallel residual and an interleaved fused qkv, "
                "not the sequential decoder layer the static decoder runs",
}
# transformers attention kernels that apply ``attn_logit_softcapping`` (SDPA ignores it)
SOFTCAPPING = ("eager", "flex_attention", "flash_attention_2", "flash_attention_3")
_CHOICES = {"qkv": (("q_proj", "k_proj", "v_proj"), ("qkv_proj",)),
            "gate_up": (("gate_proj", "up_proj"), ("gate_up_proj",)),
            "act": (("act_fn",), ("activation_fn",))}


def base_model(model: nn.Module) -> nn.Module:
    """The causal LM under a peft wrapper (its linears carry the LoRA layers), else ``model``."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@dataclass(frozen=True)
class Family:
    """A decoder layer's shape as the static decoder runs it (names of submodules).

    Attributes:
        qkv: The attention's input projections on ``self_attn``, concatenated in this order.
        gate_up: The MLP's gate and up projections on ``mlp`` (one fused, or two).
        act: The MLP's activation module on ``mlp``.
        mlp_norm: The norm before the MLP on the layer.
        out_norms: Gemma's norms of the attention and MLP outputs before each residual add.
        qk_norm: Per-head ``q_norm``/``k_norm`` on ``self_attn`` before the rotary embedding.
        rotary_by_type: The rotary embedding takes the layer's ``layer_type`` (Gemma 3).
        final_softcap: Final-logit soft-capping (Gemma), or None.
    """

    qkv: tuple[str, ...]
    gate_up: tuple[str, ...]
    act: str
    mlp_norm: str
    out_norms: bool
    qk_norm: bool
    rotary_by_type: bool
    final_softcap: float | None

    @property
    def llama(self) -> bool:
        """Llama's layer exactly (what the compiled step and a full-weight batch run)."""
        return (self.qkv == _CHOICES["qkv"][0] and self.gate_up == _CHOICES["gate_up"][0]
                and self.act == "act_fn" and not (self.out_norms or self.qk_norm
                                                  or self.rotary_by_type)
                and self.final_softcap is None)


@dataclass
class Extras:
    """One layer's differences from Llama's, as modules and numbers (None: as in Llama)."""

    q_norm: Any = None
    k_norm: Any = None
    attn_out: Any = None  # norm of the attention output before its residual add
    mlp_out: Any = None   # norm of the MLP output before its residual add
    window: int | None = None  # keys at least this far back are masked
    softcap: float | None = None  # attention-logit soft-capping
    rotary: str | None = None  # the layer type the rotary embedding is asked for


def _pick(owner: nn.Module, what: str) -> tuple[str, ...] | None:
    return next((names for names in _CHOICES[what]
                 if all(hasattr(owner, n) for n in names)), None)


def describe(model: nn.Module) -> Family | str:
    """``model``'s :class:`Family`, or why the static decoder cannot run it."""
    base = base_model(model)
    cfg = getattr(base, "config", None)
    kind = getattr(cfg, "model_type", type(base).__name__)
    if kind in OTHERS:
        return OTHERS[kind]
    if kind not in FAMILIES:
        return (f"model type {kind!r} is not one the static decoder runs "
                f"({', '.join(FAMILIES)})")
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    inner = getattr(base, "model", None)
    if not all(hasattr(inner, n) for n in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return f"the model does not have the module layout of a {kind!r} model"
    out_norms = hasattr(inner.layers[0], "pre_feedforward_layernorm")
    shapes = set()
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv, gate_up, act = _pick(attn, "qkv"), _pick(mlp, "gate_up"), _pick(mlp, "act")
        norms = ["input_layernorm", "post_attention_layernorm"] + (
            ["pre_feedforward_layernorm", "post_feedforward_layernorm"] if out_norms else [])
        if None in (qkv, gate_up, act) or not all(hasattr(layer, n) for n in norms) or not all(
                hasattr(m, n) for m, n in ((attn, "o_proj"), (attn, "scaling"),
                                           (mlp, "down_proj"))):
            return f"the model does not have the module layout of a {kind!r} model"
        shapes.add((qkv, gate_up, act[0], hasattr(attn, "q_norm") and hasattr(attn, "k_norm")))
    if len(shapes) != 1:
        return "the model's layers differ in their modules"
    qkv, gate_up, act, qk_norm = shapes.pop()
    rotary_by_type = "layer_type" in inspect.signature(inner.rotary_emb.forward).parameters
    return Family(qkv, gate_up, act,
                  "pre_feedforward_layernorm" if out_norms else "post_attention_layernorm",
                  out_norms, qk_norm, rotary_by_type,
                  getattr(base.config, "final_logit_softcapping", None))


def extras(model: nn.Module, family: Family) -> list[Extras]:
    """Per layer of ``model``, its :class:`Extras`."""
    base = base_model(model)
    cfg = base.config
    softcaps = getattr(cfg, "_attn_implementation", None) in SOFTCAPPING
    out = []
    for layer in base.model.layers:
        attn = layer.self_attn
        window = (attn.sliding_window if hasattr(attn, "sliding_window")
                  else getattr(cfg, "sliding_window", None))  # Mistral, Phi-3: the config's
        out.append(Extras(
            q_norm=attn.q_norm if family.qk_norm else None,
            k_norm=attn.k_norm if family.qk_norm else None,
            attn_out=layer.post_attention_layernorm if family.out_norms else None,
            mlp_out=layer.post_feedforward_layernorm if family.out_norms else None,
            window=window,
            softcap=getattr(attn, "attn_logit_softcapping", None) if softcaps else None,
            rotary=getattr(attn, "layer_type", None) if family.rotary_by_type else None))
    return out


def rotary(inner: nn.Module, h: torch.Tensor, pos: torch.Tensor, layers: list[Extras]
           ) -> dict[str | None, tuple[torch.Tensor, torch.Tensor]]:
    """(cos, sin) [b, 1, s, rotary dim] per rotary key the layers ask for, each computed once."""
    out = {}
    for key in dict.fromkeys(e.rotary for e in layers):
        cos, sin = inner.rotary_emb(h, pos) if key is None else inner.rotary_emb(h, pos, key)
        out[key] = cos.unsqueeze(1), sin.unsqueeze(1)
    return out


def queries_keys(y: torch.Tensor, extra: Extras, cos: torch.Tensor, sin: torch.Tensor,
                 n_heads: int, n_kv: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries [b, heads, s, d] and keys [b, kv heads, s, d] from a layer's q/k/v output ``y``
    [b, s, (heads + 2 kv heads) x d]: q_norm/k_norm, then the rotary embedding of both at once
    (of the first ``cos.shape[-1]`` dimensions of each head, the rest passed through)."""
    b, s = y.shape[:2]
    qk = y[..., :(n_heads + n_kv) * head_dim].view(b, s, -1, head_dim)
    if extra.q_norm is not None:
        qk = torch.cat([extra.q_norm(qk[:, :, :n_heads]), extra.k_norm(qk[:, :, n_heads:])], 2)
    qk = qk.transpose(1, 2)
    if cos.shape[-1] == head_dim:
        qk = qk * cos + rotate_half(qk) * sin
    else:  # partial rotary
        part, rest = qk[..., :cos.shape[-1]], qk[..., cos.shape[-1]:]
        qk = torch.cat([part * cos + rotate_half(part) * sin, rest], dim=-1)
    return qk[:, :n_heads], qk[:, n_heads:]


def windowed(attend: torch.Tensor, window: int | None) -> torch.Tensor:
    """``attend`` [b, 1, s, keys] (the queries are the last s positions) with the keys at least
    ``window`` positions before each query masked, as transformers' sliding-window mask does
    over cache positions."""
    keys, s = attend.shape[-1], attend.shape[-2]
    if window is None or keys <= window:
        return attend
    q = torch.arange(keys - s, keys, device=attend.device)[:, None]
    return attend & (torch.arange(keys, device=attend.device) > q - window)


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              attend: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    """softmax(q k^T x scale) v [b, heads, s, d] over the first ``attend.shape[-1]`` positions
    of the caches [b, kv heads, capacity, d]; with ``softcap``, the scores pass through
    ``tanh(x / softcap) x softcap`` first (as matmuls: neither SDPA nor the C++ kernel has it)."""
    keys, groups = attend.shape[-1], q.shape[1] // k_cache.shape[1]
    if softcap is None:
        if kernels.runs(q, k_cache):
            return kernels.cache_attention(q.to(k_cache.dtype), k_cache, v_cache, attend, scale)
        return F.scaled_dot_product_attention(
            q, k_cache[:, :, :keys], v_cache[:, :, :keys], attn_mask=attend, scale=scale,
            enable_gqa=groups > 1)
    k, v = k_cache[:, :, :keys], v_cache[:, :, :keys]
    if groups > 1:
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    q = q.to(k.dtype)
    scores = torch.tanh(torch.matmul(q, k.transpose(2, 3)) * scale / softcap) * softcap
    probs = scores.masked_fill(~attend, float("-inf")).softmax(-1, dtype=torch.float32)
    return torch.matmul(probs.to(v.dtype), v)
