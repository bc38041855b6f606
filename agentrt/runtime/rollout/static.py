"""A decode loop for rotary decoder-only models (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3) with a pre-allocated KV cache and sampling on tensors.

``model.generate`` pays per token for what a rollout does not need: a cache grown by copies
(``torch.cat``), logits processors and stopping criteria as Python objects, all logits kept for
the log-probs (B x T x V), finished rows computed to the end. This loop prefills once, then runs
one forward of the new tokens per step against a cache allocated once (prompt width +
``max_new_tokens``), samples on tensors with each token's log-prob, and drops finished rows.

It calls the model's own submodules (embedding, norms, projections, MLP, rotary embedding), so
peft LoRA layers, peft's ``disable_adapter`` and weights swapped in by pointer (frozen snapshots)
all apply as in ``generate``; only attention and the cache are its own (with ``compile``, the
decode step of one Llama-layout model's weights is compiled: :mod:`agentrt.runtime.rollout.compiled`).
Each family's differences from Llama's layer (q/k norms, fused projections, Gemma's extra norms,
sliding windows, soft-capping, partial rotary) are read from its modules by
:mod:`agentrt.runtime.rollout.families`. Models it does not know (:func:`unsupported_reason`) fall
back to ``generate``.

One call may also decode rows of several policies at once (``adapters=``, a league tick's learner
and snapshots): LoRA adapters as one mixed batch over the shared base
(:class:`~agentrt.runtime.rollout.plan.Projection`), or full-weight snapshots, each run of rows through
its own weights (``frozen=``, :meth:`StaticDecoder._grouped_plan`).

Semantics are ``generate``'s: left padding, position ids counted over the attention mask, greedy
at temperature 0, else temperature, top-k and top-p applied like transformers' warpers, rows that
emitted eos emit pad afterwards, streamer ``put`` gets the prompt ids, then one id per row per
step, then ``end`` is called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from agentrt.config.rollout import SamplingConfig
from agentrt.runtime.rollout import families
from agentrt.runtime.rollout.compiled import CompiledStep, plain_plan
from agentrt.runtime.rollout.families import Extras, base_model
from agentrt.runtime.rollout.plan import GroupedLinear, GroupedNorm, MixedRows, Projection, _Module

COMPACT_FRACTION = 0.25  # drop finished rows once this share of the active batch has finished


def unsupported_reason(model: nn.Module) -> str | None:
    """Why the static decoder cannot run ``model`` (None when it can; see
    :func:`~agentrt.runtime.rollout.families.describe`)."""
    family = families.describe(model)
    return family if isinstance(family, str) else None


def top_k_top_p(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """transformers' TopKLogitsWarper then TopPLogitsWarper (min_tokens_to_keep 1). [b,V]->[b,V]."""
    if top_k > 0:
        kth = torch.topk(scores, min(top_k, scores.size(-1)))[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - top_p)
        remove[..., -1:] = False
        scores = scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    return scores


def sampling_cdf(probs: torch.Tensor) -> torch.Tensor:
    """The CDF :func:`sample` inverts, summed in float64: in float32 the sum is within 6e-8 of
    1 long before a 32k-128k vocabulary ends, so every later token below about 3e-8 had an
    empty interval and was never drawn (up to 8.5e-4 of total variation)."""
    return probs.to(torch.float64).cumsum(dim=-1)


def sample(probs: torch.Tensor) -> torch.Tensor:
    """One draw per row of ``probs`` [b, V] by inverse CDF: one uniform per row, where
    ``torch.multinomial`` draws an exponential per token (12% of a llama-tiny decode step)."""
    cdf = sampling_cdf(probs)
    u = torch.rand(probs.shape[0], 1, device=probs.device, dtype=cdf.dtype) * cdf[:, -1:]
    # right=True: the first token whose cdf exceeds u; a zero-probability token never does first
    return torch.searchsorted(cdf, u, right=True).clamp_(max=probs.shape[1] - 1).squeeze(1)


def distinct_rows(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, inverse) of the rows of ``key`` [b, w]: the index of each distinct row's first
    occurrence, and each row's distinct row (``key[first][inverse] == key``). A dict of tuples:
    ``torch.unique(dim=0)`` sorted and compared rows one by one, 1 ms of a 20 ms generate."""
    groups: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    inverse = []
    for i, row in enumerate(map(tuple, key.tolist())):
        if row not in groups:
            groups[row] = len(first)
            first.append(i)
        inverse.append(groups[row])
    return torch.tensor(first), torch.tensor(inverse)


def _prefill_mask(valid: torch.Tensor) -> torch.Tensor:
    """[b, W] valid prompt keys -> [b, 1, W, W] causal attention mask over them. A pad query also
    sees itself: an empty row is NaN in SDPA, and a NaN masked value still poisons the matmul."""
    width = valid.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=valid.device).tril()
    eye = torch.eye(width, dtype=torch.bool, device=valid.device)
    return ((causal & valid[:, None, :]) | eye)[:, None]


class StaticDecoder:
    """Batched generation with per-token log-probs for one causal LM module.

    Args:
        model: A causal LM of a family the decoder runs, plain or peft-wrapped (checked by
            :func:`unsupported_reason`).
        pad_id: Emitted by rows after they finished.
        eos_id: Ends a row.
        autocast_dtype: ``torch.bfloat16`` for bf16 autocast (the KV cache is kept in it too:
            autocast computes attention in it anyway), None for the model's dtype.
        compile: Decode steps of one model's own weights through torch.compile
            (:mod:`agentrt.runtime.rollout.compiled`; ``policy.compile``): Llama's layer
            only, other families run the eager step.
    """

    def __init__(self, model: nn.Module, pad_id: int, eos_id: int,
                 autocast_dtype: torch.dtype | None = None, compile: bool = False) -> None:
        family = families.describe(model)
        if isinstance(family, str):
            raise ValueError(f"the static decoder cannot run this model: {family}")
        self.model, self.family = model, family
        self.pad_id, self.eos_id = pad_id, eos_id
        self.autocast_dtype = autocast_dtype
        cfg = base_model(model).config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.step = (CompiledStep(base_model(model).model, self.n_heads, self.n_kv, self.head_dim)
                     if compile and family.llama else None)

    @torch.inference_mode()
    def generate(self, ids: torch.Tensor, mask: torch.Tensor, sampling: SamplingConfig,
                 streamer: Any = None, adapters: list[str] | None = None,
                 frozen: dict[str, dict[str, torch.Tensor]] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Generates from a left-padded batch.

        Args:
            ids: Prompt ids [B, W], left-padded.
            mask: Attention mask [B, W] (1 on prompt tokens).
            sampling: Temperature (0: greedy), top_k, top_p, max_new_tokens.
            streamer: transformers' streamer protocol, or None.
            adapters: Per row, the peft LoRA adapter it runs as (a mixed batch: peft's
                ``adapter_names``, each LoRA layer computes each adapter's rows with its own
                weights, the base weights once for all); None: the active adapter for all.
            frozen: With ``adapters``, a full-weight batch instead: rows named here run with
                these weights (a snapshot's state dict; tensors it lacks are the module's),
                the other rows with the module's own (see :func:`grouped_unsupported`).

        Returns:
            (tokens [B, T], log-probs [B, T] float32): T <= max_new_tokens; after a row's eos its
            tokens are pad and its log-probs 0. Log-probs are under the temperature-scaled
            distribution (before top-k/top-p), like the HF path's.
        """
        inner = base_model(self.model).model
        device = inner.embed_tokens.weight.device
        ids, mask = ids.to(device), mask.to(device)
        batch, width = ids.shape
        steps = sampling.max_new_tokens
        if streamer is not None:
            streamer.put(ids.cpu())
        autocast = torch.autocast(device.type, dtype=self.autocast_dtype,
                                  enabled=self.autocast_dtype is not None)
        kv_dtype = self.autocast_dtype or inner.embed_tokens.weight.dtype
        order = None if adapters is None else {a: k for k, a in enumerate(dict.fromkeys(adapters))}
        plan = (self._plan(kv_dtype, order, batch) if frozen is None else
                self._grouped_plan(kv_dtype, list(order or ()), frozen, device))
        caches = [tuple(torch.empty(batch, self.n_kv, width + steps, self.head_dim,
                                    dtype=kv_dtype, device=device) for _ in "kv")
                  for _ in inner.layers]
        valid = torch.ones(batch, width + steps, dtype=torch.bool, device=device)
        valid[:, :width] = mask.bool()  # keys a row may attend to
        pos = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        with autocast:
            logits = self._prefill(plan, caches, ids, mask, pos, valid, adapters, order)
        return self._decode(plan, caches, logits, pos[:, -1:], valid, width, sampling, streamer,
                            adapters, order, autocast)

    def _prefill(self, plan: Any, caches: list[Any], ids: torch.Tensor, mask: torch.Tensor,
                 pos: torch.Tensor, valid: torch.Tensor, adapters: list[str] | None,
                 order: dict[str, int] | None) -> torch.Tensor:
        """The prompts' keys and values into ``caches``; the first logits [B, V].

        Rows of one prompt (a GRPO group's) are prefilled once: their keys, values and first
        logits are the same, and the sampling still draws every row on its own. Rows of
        different adapters compute different keys from the same prompt."""
        batch, width = ids.shape
        device = ids.device
        key = ids.masked_fill(mask == 0, -1)
        if order is not None:
            key = torch.cat([torch.tensor([order[a] for a in adapters], device=device)[:, None],
                             key], dim=1)
        first, inverse = distinct_rows(key)
        if len(first) == batch:
            mixed = None if order is None else MixedRows(adapters, order, device)
            return self._forward(plan, caches, ids, pos, 0, _prefill_mask(valid[:, :width]), mixed)
        first, inverse = first.to(device), inverse.to(device)
        kv_dtype, n_layers = caches[0][0].dtype, len(caches)
        once = [tuple(torch.empty(len(first), self.n_kv, width, self.head_dim, dtype=kv_dtype,
                                  device=device) for _ in "kv") for _ in range(n_layers)]
        logits = self._forward(plan, once, ids[first], pos[first], 0,
                               _prefill_mask(valid[first, :width]),
                               None if order is None else MixedRows(
                                   [adapters[i] for i in first.tolist()], order, device))[inverse]
        for (k, v), (k1, v1) in zip(caches, once):
            k[:, :, :width], v[:, :, :width] = k1[inverse], v1[inverse]
        return logits

    def _decode(self, plan: Any, caches: list[Any], logits: torch.Tensor, pos: torch.Tensor,
                valid: torch.Tensor, width: int, sampling: SamplingConfig, streamer: Any,
                adapters: list[str] | None, order: dict[str, int] | None, autocast: Any
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples from ``logits`` and decodes one token a step until every row ended; finished
        rows are compacted out of the cache once enough of them did."""
        batch, steps, device = logits.shape[0], sampling.max_new_tokens, logits.device
        out = torch.full((batch, steps), self.pad_id, dtype=torch.long, device=device)
        logps = torch.zeros(batch, steps, dtype=torch.float32, device=device)
        rows = torch.arange(batch, device=device)  # full-batch index of each active row
        alive = torch.ones(batch, dtype=torch.bool, device=device)
        mixed = None if order is None else MixedRows(adapters, order, device)
        compiled = (self.step is not None and order is None and plain_plan(plan) and all(
            e.window is None or e.window >= width + steps for e in plan.extras))
        decode = self.step.bind(plan) if compiled else self._forward
        for t in range(steps):
            token, logp = self._sample(logits, sampling)
            token = token.masked_fill(~alive, self.pad_id)  # finished rows emit pad
            out[rows, t] = token
            logps[rows, t] = logp.masked_fill(~alive, 0.0)
            alive &= token != self.eos_id
            if streamer is not None:
                streamer.put(out[:, t].cpu())
            n_alive = int(alive.sum())
            if n_alive == 0 or t == steps - 1:
                break
            if len(rows) - n_alive >= max(1, int(COMPACT_FRACTION * len(rows))):
                if order is not None:
                    adapters = [adapters[i] for i in alive.nonzero().squeeze(1).tolist()]
                    mixed = MixedRows(adapters, order, device)
                rows, token, pos, valid = rows[alive], token[alive], pos[alive], valid[alive]
                caches = [(k[alive], v[alive]) for k, v in caches]
                alive = alive[alive]
            pos = pos + 1
            with autocast:
                logits = decode(plan, caches, token[:, None], pos, width + t,
                                valid[:, None, None, :width + t + 1], mixed)
        if streamer is not None:
            streamer.end()
        return out[:, :t + 1], logps[:, :t + 1]

    def _sample(self, logits: torch.Tensor, s: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
        """Next token and its log-prob under the temperature-scaled distribution. [b,V]->[b],[b]."""
        logits = logits.float()
        if s.temperature == 0.0:
            token = logits.argmax(dim=-1)
            scaled = logits
        else:
            scaled = logits / s.temperature
            token = sample(top_k_top_p(scaled, s.top_k, s.top_p).softmax(dim=-1))
        logp = scaled.gather(-1, token[:, None]).squeeze(1) - torch.logsumexp(scaled, dim=-1)
        return token, logp

    def _forward(self, plan: Plan, caches: list[tuple[torch.Tensor, torch.Tensor]],
                 tokens: torch.Tensor, pos: torch.Tensor, start: int, attend: torch.Tensor,
                 adapters: MixedRows | None = None) -> torch.Tensor:
        """Logits of the last position [b, V]; writes the new keys/values at ``start``.

        ``tokens``/``pos`` [b, s]; ``attend`` [b, 1, s, start + s] (True: may attend);
        ``adapters``: each row's LoRA adapter (see :meth:`generate`)."""
        inner = base_model(self.model).model
        b, s = tokens.shape
        h = plan.embed(tokens, adapters)
        rotary = families.rotary(inner, h, pos, plan.extras)
        masks = {None: attend}  # per sliding window, ``attend`` with the keys beyond it masked
        for layer, (in_norm, qkv, o_proj, mlp_norm, gate_up, down), extra, (k_cache, v_cache) in \
                zip(inner.layers, plan.layers, plan.extras, caches):
            y = qkv(in_norm(h, adapters), adapters)  # [b, s, (heads + 2 kv heads) x head_dim]
            q, k = families.queries_keys(y, extra, *rotary[extra.rotary], self.n_heads,
                                         self.n_kv, self.head_dim)
            k_cache[:, :, start:start + s] = k
            v_cache[:, :, start:start + s] = y[..., (self.n_heads + self.n_kv) * self.head_dim:
                                               ].view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
            if extra.window not in masks:
                masks[extra.window] = families.windowed(attend, extra.window)
            o = families.attention(q, k_cache, v_cache, masks[extra.window],
                                   layer.self_attn.scaling, extra.softcap)
            o = o_proj(o.transpose(1, 2).reshape(b, s, -1), adapters)
            h = h + (o if extra.attn_out is None else extra.attn_out(o))
            gate, up = gate_up(mlp_norm(h, adapters), adapters).chunk(2, dim=-1)
            o = down(getattr(layer.mlp, self.family.act)(gate) * up, adapters)
            h = h + (o if extra.mlp_out is None else extra.mlp_out(o))
        logits = plan.head(plan.norm(h[:, -1], adapters), adapters)
        cap = self.family.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _plan(self, dtype: torch.dtype, order: dict[str, int] | None = None,
              rows: int = 256) -> Plan:
        """Per layer the q/k/v, o, gate/up and down projections as this call computes them, and
        the LM head (``order``: the adapters of a mixed batch, see :class:`Projection`; ``rows``:
        the call's batch)."""
        base = base_model(self.model)
        names = list(order or ())
        layers = []

        def proj(*modules: nn.Module) -> Projection:
            return Projection(list(modules), dtype, names, rows)

        fam = self.family
        for layer in base.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            layers.append((_Module(layer.input_layernorm),
                           proj(*(getattr(attn, n) for n in fam.qkv)), proj(attn.o_proj),
                           _Module(getattr(layer, fam.mlp_norm)),
                           proj(*(getattr(mlp, n) for n in fam.gate_up)), proj(mlp.down_proj)))
        return Plan(_Module(base.model.embed_tokens, lora=True), layers,
                    _Module(base.model.norm), proj(base.lm_head),
                    families.extras(self.model, fam))

    def _grouped_plan(self, dtype: torch.dtype, names: list[str],
                      frozen: dict[str, dict[str, torch.Tensor]], device: torch.device) -> Plan:
        """The plan of a full-weight batch: per group (``names[k]``) its own weights, the
        snapshot's where ``frozen`` has them, else the module's; q/k/v and gate/up concatenated
        and cast once per call, as :class:`Projection` does for one model."""
        base = base_model(self.model)
        live = dict(base.named_parameters())

        def each(key: str) -> list[torch.Tensor]:
            return [frozen[n][key].to(device) if key in frozen.get(n, {}) else live[key]
                    for n in names]

        def linear(*keys: str) -> GroupedLinear:
            per_key = [each(f"{key}.weight") for key in keys]
            return GroupedLinear([(ws[0] if len(ws) == 1 else torch.cat(ws)).to(dtype)
                                  for ws in zip(*per_key)])

        eps = base.model.norm.variance_epsilon
        fam = self.family
        layers = []
        for i in range(len(base.model.layers)):
            at = f"model.layers.{i}."
            layers.append((GroupedNorm(each(at + "input_layernorm.weight"), eps),
                           linear(*(at + "self_attn." + n for n in fam.qkv)),
                           linear(at + "self_attn.o_proj"),
                           GroupedNorm(each(at + "post_attention_layernorm.weight"), eps),
                           linear(*(at + "mlp." + n for n in fam.gate_up)),
                           linear(at + "mlp.down_proj")))
        embed = each("model.embed_tokens.weight")
        # tied weights are one parameter, named by the embedding alone
        head = each("lm_head.weight") if "lm_head.weight" in live else embed
        return Plan(GroupedLinear(embed, F.embedding), layers,
                    GroupedNorm(each("model.norm.weight"), eps),
                    GroupedLinear([w.to(dtype) for w in head]), families.extras(self.model, fam))


def grouped_unsupported(model: nn.Module) -> str | None:
    """Why the static decoder cannot run a full-weight batch of ``model`` (``frozen=``): it
    needs Llama's layer up to fused projections (Llama, Mistral, Phi-3): a plain embedding,
    Llama's RMSNorm and no other norm, every projection a plain bias-free ``nn.Linear`` (None
    when it can). Callers run each snapshot on its own instead (``SharedModel.generate_many``)."""
    family = families.describe(model)
    if isinstance(family, str):
        return family
    if base_model(model) is not model:
        return "a peft model batches its adapters instead (adapters= without frozen=)"
    inner = model.model
    if family.qk_norm or family.out_norms or type(inner.embed_tokens) is not nn.Embedding or \
            not hasattr(inner.norm, "variance_epsilon"):
        return (f"a full-weight batch runs Llama's embedding and norms only; model type "
                f"{model.config.model_type!r} has others (q/k norms, Gemma's scaled embedding "
                "and norms)")
    for layer in inner.layers:
        for m in [layer.self_attn.o_proj, layer.mlp.down_proj] + [
                getattr(layer.self_attn, n) for n in family.qkv] + [
                getattr(layer.mlp, n) for n in family.gate_up]:
            if type(m) is not nn.Linear or m.bias is not None:
                return "a projection is not a plain bias-free nn.Linear"
    return None


@dataclass
class Plan:
    """What one generate call computes with: the embedding, per layer (norm, q/k/v, o, norm,
    gate/up, down), the final norm and the LM head, each called as ``step(x, rows)``; per layer
    its differences from Llama's (:class:`~agentrt.runtime.rollout.families.Extras`)."""

    embed: Any
    layers: list[tuple[Any, Any, Any, Any, Any, Any]]
    norm: Any
    head: Any
    extras: list[Extras]
