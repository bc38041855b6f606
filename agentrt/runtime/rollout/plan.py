"""The steps of a static decoder's plan (:class:`~agentrt.runtime.rollout.static.Plan`): projections
over concatenated weights, a mixed batch of LoRA adapters as batched matmuls
(:class:`MixedRows`, :class:`Projection`), and the per-group linears and norms of a batch of
full-weight snapshots (:class:`GroupedLinear`, :class:`GroupedNorm`)."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from agentrt.runtime.rollout import packed


class MixedRows:
    """The rows of a mixed-adapter batch (``adapters[i]``: row i's LoRA adapter, ``order``:
    adapter -> index k) laid out for batched LoRA matmuls: adapter k's rows at ``k * width``
    onward of a [adapters x width] grid, ``gather`` the batch row of each grid slot (padding
    slots repeat row 0 and are never read back), ``place`` the grid slot of each batch row."""

    def __init__(self, adapters: list[str], order: dict[str, int], device: torch.device) -> None:
        self.names, self.order, self.device = adapters, order, device
        self.k = len(order)

    @functools.cached_property
    def grid(self) -> tuple[int, torch.Tensor, torch.Tensor]:  # (width, gather, place)
        slots: list[list[int]] = [[] for _ in self.order]
        for i, name in enumerate(self.names):
            slots[self.order[name]].append(i)
        width = max(1, max(len(rows) for rows in slots))
        gather, place = [0] * (self.k * width), [0] * len(self.names)
        for k, rows in enumerate(slots):
            for j, i in enumerate(rows):
                gather[k * width + j], place[i] = i, k * width + j
        return (width, torch.tensor(gather, device=self.device),
                torch.tensor(place, device=self.device))

    @functools.cached_property
    def group(self) -> torch.Tensor:
        """Each row's group index (a full-weight batch's norms)."""
        return torch.tensor([self.order[name] for name in self.names], device=self.device)

    @functools.cached_property
    def runs(self) -> list[tuple[int, int, int]]:
        """(group, start, stop) of each run of consecutive rows of one group."""
        runs: list[tuple[int, int, int]] = []
        for i, name in enumerate(self.names):
            if runs and runs[-1][0] == self.order[name]:
                runs[-1] = (self.order[name], runs[-1][1], i + 1)
            else:
                runs.append((self.order[name], i, i + 1))
        return runs


class Projection:
    """``x -> cat([m(x) for m in modules], -1)``: one matmul over concatenated weights when every
    module is a plain ``nn.Linear`` (peft's LoRA layers are called as they are).

    The weights are read (and, under autocast, cast to its dtype) once, when the projection is
    built at the start of a generate call, instead of at every step: autocast casts an fp32
    weight again on every call of the module. The math is autocast's: bf16 inputs and weights.

    A mixed batch (``adapters``: the call's LoRA adapters in order) computes a plain LoRA linear
    as its base layer over all rows plus, per adapter, ``x A^T (B^T scaling)`` of its rows: A and
    B of every adapter stacked once per call (ranks zero-padded to the largest), two batched
    matmuls over the rows laid out by :class:`MixedRows` instead of a loop over adapters. Other
    peft layers (DoRA, dropout while training, merged) run peft's own mixed batch.

    On CPU the concatenated weight is also packed for oneDNN (:mod:`agentrt.runtime.rollout.packed`,
    ``rows``: about how many rows a call runs)."""

    def __init__(self, modules: list[nn.Module], dtype: torch.dtype,
                 adapters: list[str] | None = None, rows: int = 256) -> None:
        self.modules = modules
        self.weight: torch.Tensor | None = None
        self.packed: torch.Tensor | None = None
        if all(type(m) is nn.Linear for m in modules) and len(
                {m.bias is None for m in modules}) == 1:
            self.weight = torch.cat([m.weight for m in modules]).to(dtype).detach()
            self.bias = (None if modules[0].bias is None
                         else torch.cat([m.bias for m in modules]).to(dtype).detach())
            self.packed = packed.pack(self.weight, rows)
        self.lora = [_stacked_lora(m, adapters, dtype) if adapters else None for m in modules]

    def __call__(self, x: torch.Tensor, adapters: MixedRows | None = None) -> torch.Tensor:
        if self.weight is not None:
            return packed.linear(x, self.weight, self.packed, self.bias)
        outs = []
        for m, lora in zip(self.modules, self.lora):
            if adapters is None or lora is None:
                outs.append(_call(m, x, None if adapters is None else adapters.names))
                continue
            rows = x if x.dim() == 3 else x[:, None]  # [b, s, in]
            s = rows.shape[1]
            width, gather, place = adapters.grid
            grid = rows[gather].reshape(adapters.k, width * s, -1)
            delta = torch.bmm(torch.bmm(grid.to(lora[0].dtype), lora[0]), lora[1])
            delta = delta.view(adapters.k * width, s, -1)[place]
            y = m.base_layer(x)
            outs.append(y + delta.view(y.shape).to(y.dtype))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


def _stacked_lora(module: nn.Module, adapters: list[str], dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """[k, in, r] and [k, r, out] (scaling folded in) of ``adapters`` on a plain peft LoRA
    linear, zeros for an adapter it lacks; None for anything else (peft's mixed batch runs it)."""
    if not (hasattr(module, "lora_A") and isinstance(getattr(module, "base_layer", None), nn.Linear)
            ) or module.merged or module.disable_adapters or any(
            name in getattr(module, "lora_variant", {}) or (
                module.training and not isinstance(module.lora_dropout[name], nn.Identity))
            for name in adapters if name in module.lora_A):
        return None
    present = [name for name in adapters if name in module.lora_A]
    rank = max((module.lora_A[name].weight.shape[0] for name in present), default=1)
    base = module.base_layer
    a = torch.zeros(len(adapters), base.in_features, rank, dtype=dtype, device=base.weight.device)
    b = torch.zeros(len(adapters), rank, base.out_features, dtype=dtype,
                    device=base.weight.device)
    for k, name in enumerate(adapters):
        if name in module.lora_A:
            r = module.lora_A[name].weight.shape[0]
            a[k, :, :r] = module.lora_A[name].weight.T
            b[k, :r] = module.lora_B[name].weight.T * module.scaling[name]
    return a, b


def _call(module: nn.Module, x: torch.Tensor, adapters: list[str] | None) -> torch.Tensor:
    """``module(x)``; a peft LoRA layer given per-row ``adapters`` runs them as a mixed batch."""
    if adapters is not None and hasattr(module, "lora_A"):
        return module(x, adapter_names=adapters)
    return module(x)


class _Module:
    """A module of the model called as a plan step: ``(x, rows) -> module(x)``; ``lora``: a
    peft layer given a mixed batch's row adapters runs them (the embedding)."""

    def __init__(self, module: nn.Module, lora: bool = False) -> None:
        self.module, self.lora = module, lora

    def __call__(self, x: torch.Tensor, rows: MixedRows | None = None) -> torch.Tensor:
        if self.lora and rows is not None:
            return _call(self.module, x, rows.names)
        return self.module(x)


class GroupedLinear:
    """A full-weight batch's linear (or, with ``op=F.embedding``, its token embedding): each run
    of one group's rows through that group's weight."""

    def __init__(self, weights: list[torch.Tensor], op: Any = F.linear) -> None:
        self.weights, self.op = weights, op

    def __call__(self, x: torch.Tensor, rows: MixedRows) -> torch.Tensor:
        outs = [self.op(x[a:b], self.weights[k]) for k, a, b in rows.runs]
        return outs[0] if len(outs) == 1 else torch.cat(outs)


class GroupedNorm:
    """A full-weight batch's RMSNorm: transformers' LlamaRMSNorm (fp32 statistics, the weight
    times the input-dtype result) with each row's group's weight."""

    def __init__(self, weights: list[torch.Tensor], eps: float) -> None:
        self.weight, self.eps = torch.stack(weights), eps

    def __call__(self, x: torch.Tensor, rows: MixedRows) -> torch.Tensor:
        weight = self.weight[rows.group]
        return rms_norm(x, weight if x.dim() == 2 else weight[:, None], self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: fp32 statistics, the weight times the input-dtype result."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)
