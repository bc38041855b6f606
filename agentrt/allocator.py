"""Keeping freed memory in the process between steps (``runtime.keep_freed_memory``).

A training step allocates the same large tensors every time (activations, gradients, the
decoder's KV cache) and frees them at its end. glibc's malloc serves every allocation over its
mmap threshold (32 MB at most) with a fresh ``mmap`` and returns it with ``munmap`` when freed,
so the next step faults every page in again and the kernel zeroes it. On this project's VMs a
llama-small GRPO update (fp32, 256 sequences) took 1.5-5.4 s with the default allocator and
1.3-1.8 s with its freed memory kept (docs/performance.md); the system CPU time is that
faulting. PyTorch's CPU tuning guide recommends jemalloc or tcmalloc for the same reason; this
gets glibc to do it without a preloaded library: no mmap for large blocks (``M_MMAP_MAX`` 0),
no trimming of the heap's top (``M_TRIM_THRESHOLD``), one arena for all threads (``M_ARENA_MAX``
1, so the controller's pool threads reuse the same heap). The cost: the process keeps its peak
memory after a step instead of returning it (the resident size stays at its high-water mark).

Applies to allocations made after the call; a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # glibc's malloc.h
_APPLIED: list[bool] = []


def keep_freed_memory(enabled: bool = True) -> bool:
    """Sets glibc's malloc to keep freed memory (once per process). Returns whether it is set."""
    if not enabled:
        return bool(_APPLIED)
    if _APPLIED:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    ok = all(libc.mallopt(param, value) == 1 for param, value in
             ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2 ** 31 - 1), (M_ARENA_MAX, 1)))
    if not ok:
        log.warning("mallopt refused a setting: freed memory may still go back to the OS")
    _APPLIED.append(ok)
    return ok
