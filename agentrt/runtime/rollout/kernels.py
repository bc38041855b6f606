"""The static decoder's attention over its KV cache as one C++ kernel (``cache_attention.cpp``).

A decode step's query is one token per row. SDPA's CPU flash kernel pays two small GEMM calls
for every row and head of it, and written as tensor ops for torch.compile it becomes a loop
over the keys that recomputes the query's rotary embedding for every key, with softmax as
separate passes over the scores. The kernel reads each row's keys once and its values once,
the query and the weighted sum of values held in registers, and prefetches the next row's
block (the hardware prefetcher stops at every short block of the cache): llama-small, 256
rows, bf16, compiled, the attention of a generate call 49 -> 21-28 ms of ~180-200 ms
(docs/performance.md). The prefill's queries (a few per row, causal mask) go through it too.

Built by ``make install`` where a C++ compiler is (:func:`build`), else on first use, with
torch's C++ extension loader (ninja and the C++ compiler that torch.compile needs anyway; ~20 s
once, cached under ``TORCH_EXTENSIONS_DIR``). Where it
cannot be built, :func:`available` is False (and says why in one warning) and the decoder keeps
SDPA, the compiled step its tensor-op attention: the same tokens, slower.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import tempfile
import threading
from pathlib import Path

import torch

from agentrt.core.compiler import find_compiler, missing

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("cache_attention.cpp")
_lock = threading.Lock()
_loaded: list[bool] = []  # the first call's answer, read without the lock afterwards
CFLAGS = ["-O3", "-march=native", "-fopenmp"]


def available() -> bool:
    """Whether ``torch.ops.agentrt_kernels.cache_attention`` is loaded (built on first call;
    asked per layer and step, so later calls take no lock)."""
    if not _loaded:
        with _lock:  # a library registers its operators once per process
            if not _loaded:
                _loaded.append(_load())
    return _loaded[0]


def build_name() -> str:
    """The extension's name: one per source, compiler flags, torch version (its ABI) and the
    CPU's full instruction set (``-march=native``: a home folder shared by machines of two CPU
    models that both report AVX-512 must not load one's build on the other)."""
    key = "\n".join([SOURCE.read_text(), " ".join(CFLAGS), torch.__version__, cpu_flags()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"agentrt_cache_attention_{torch.backends.cpu.get_cpu_capability().lower()}_{digest}"


def cpu_flags() -> str:
    """The CPU's instruction-set flags, sorted (``/proc/cpuinfo``'s ``flags``, ``Features`` on
    ARM); elsewhere the machine and processor names."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return " ".join(sorted(value.split()))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _load() -> bool:
    from torch.utils import cpp_extension

    # One build per source and instruction set (-march=native; a shared home directory may
    # see other CPUs). Each process that finds no build makes its own in a folder of its own
    # and moves the library into place: torch's loader guards its shared build folder with a
    # lock file that a process killed mid-build (kill -9 of a worker) leaves behind, and every
    # later load waits on it forever.
    name = build_name()
    if find_compiler("c++") is None:
        log.warning("the cache attention kernel was not built: no C++ compiler (%s); attention "
                    "runs as SDPA or tensor ops (same tokens, slower decoding); install g++ "
                    "(make system-packages)", missing("c++"))
        return False
    try:
        folder = Path(cpp_extension._get_build_directory(name, verbose=False))
        built = folder / f"{name}.so"
        if built.exists():
            torch.ops.load_library(str(built))
        else:
            with tempfile.TemporaryDirectory(dir=folder) as own:
                cpp_extension.load(name=name, sources=[str(SOURCE)], build_directory=own,
                                   extra_cflags=CFLAGS,
                                   extra_ldflags=["-fopenmp"], is_python_module=False,
                                   verbose=False)
                os.replace(Path(own) / f"{name}.so", built)
    except Exception as e:  # no ninja, a failed build: SDPA and the tensor-op attention run
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        log.warning("the cache attention kernel was not built (%s: %s); attention runs as "
                    "SDPA or tensor ops (same tokens, slower decoding)", type(e).__name__, first)
        log.debug("the kernel's build failed", exc_info=True)
        return False
    torch.library.register_fake("agentrt_kernels::cache_attention")(_fake)
    return True


def _fake(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, attend: torch.Tensor,
          scale: float) -> torch.Tensor:
    return q.new_empty(q.shape)


def runs(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether :func:`cache_attention` runs these tensors (CPU, fp32 or bf16, a contiguous
    cache), building it on the first call."""
    return (q.device.type == "cpu" and k_cache.dtype in (torch.float32, torch.bfloat16)
            and k_cache.is_contiguous() and available())


def cache_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    attend: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T x scale) v of queries ``q`` [b, heads, s, d] (in the cache's dtype) over
    the first ``attend.shape[-1]`` positions of ``k_cache``/``v_cache`` [b, kv heads, capacity,
    d] (contiguous), masked by ``attend`` [b, 1, s, keys] (True: may attend; its last
    dimension contiguous); fp32 scores and sums; [b, heads, s, d] in the cache's dtype. A key
    no query may see is not read. Needs :func:`available`."""
    return torch.ops.agentrt_kernels.cache_attention(q, k_cache, v_cache, attend, scale)


def build() -> None:
    """``make install``: builds the kernel now, printing one line (its warning says why when
    it cannot be built; an install never fails on it)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    built = available()
    print(f"agentrt: cache attention kernel {'built' if built else 'not built'} "
          f"({build_name()}){'' if built else '; decoding uses SDPA (slower, same tokens)'}")
