"""Linear layers of a generate call through oneDNN, each weight packed once per call.

On x86 CPUs PyTorch runs an fp32 ``F.linear`` through MKL's sgemm, which on AMD CPUs takes its
AVX2 path: on an AMD EPYC with AVX-512, 200-215 GFLOP/s at a decode step's shapes (256 rows,
llama-small's projections), where oneDNN's inner product over a weight reordered once into its
blocked layout runs at 460-540 (bf16: 900-940 -> 920-1040). A generate call reads every weight
once per step and never changes it, so :func:`pack` reorders it when the call starts (0.1 ms per
million weights) and :func:`linear` runs every step through the packed copy. The result is fp32
(or bf16) math like ``F.linear``'s; only the order of the sums differs.

The compiled decode step (:mod:`agentrt.runtime.rollout.compiled`) cannot take a packed tensor (oneDNN's
opaque layout) as a graph input, so it calls :func:`packed_linear`, an operator that inductor
keeps as one external call and that finds the packed copy of its weight in the packs of the
running call (:func:`using`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F

_local = threading.local()


def packable(weight: torch.Tensor) -> bool:
    """Whether oneDNN runs ``weight`` (a CPU fp32 or bf16 matrix, bf16 only where the CPU has
    bf16 instructions)."""
    return (weight.device.type == "cpu" and weight.dim() == 2 and not weight.requires_grad
            and torch.backends.mkldnn.is_available()
            and (weight.dtype == torch.float32 or (
                weight.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())))


def pack(weight: torch.Tensor, rows: int) -> torch.Tensor | None:
    """``weight`` [out, in] reordered for oneDNN's inner product of about ``rows`` rows (the
    layout hardly depends on it), or None where oneDNN does not run it."""
    if not packable(weight):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight, max(1, rows))


def linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` in ``weight``'s dtype (as autocast computes it), through
    ``packed`` (:func:`pack` of ``weight``) when there is one."""
    x = x.to(weight.dtype)
    if packed is None:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@contextlib.contextmanager
def using(packs: dict[int, torch.Tensor]) -> Iterator[None]:
    """Within: :func:`packed_linear` finds a weight's packed copy in ``packs`` (the weight's
    ``data_ptr()`` -> :func:`pack` of it), on this thread."""
    outer = getattr(_local, "packs", None)
    _local.packs = packs
    try:
        yield
    finally:
        _local.packs = outer


@torch.library.custom_op("agentrt::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """:func:`linear` of ``x`` and ``weight`` through the packed copy that :func:`using` holds
    for it (``F.linear`` where it holds none)."""
    packed = (getattr(_local, "packs", None) or {}).get(weight.data_ptr())
    return linear(x, weight, packed if packed is not None and packed.shape == weight.shape
                  else None)


@packed_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=weight.dtype)
