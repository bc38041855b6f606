"""Keeping freed memory in the process between steps (``runtime.keep_freed_memory``).

A training step allocates the same large tensors every time (activations, gradients, the
decoder's KV cache) and frees them at its end. glibc's malloc serves every allocation over its
mmap threshold (32 MB at most) with a fresh ``mmap`` and returns it with ``munmap`` when freed,
so the next step faults every page in again and the kernel zeroes it. On this project's VMs a
llama-small GRPO update (fp32, 256 sequences) took 1.5-5.4 s with the default allocator and
1.3-1.8 s with its freed memory kept (docs/performance.md); the system CPU time is that
faulting. PyTorch's CPU tuning guide recommends jemalloc or tcmalloc for the same reason; this
gets glibc to do it without a preloaded library: no mmap for large blocks (``M_MMAP_MAX`` 0)
and no trimming of a heap's top (``M_TRIM_THRESHOLD``). The arenas stay one per thread: with
one arena for all (``M_ARENA_MAX`` 1) a llama-tiny decode took 0.18 s against 0.13, its OpenMP
threads waiting on the arena's lock. The cost: the process keeps its peak memory after a step
instead of returning it (the resident size stays at its high-water mark).

Applies to allocations made after the call; a no-op where the C library is not glibc.

Python's own garbage collector is the other per-step memory cost: a full (generation 2)
collection walks every tracked object, and after the model, its compiled graphs and the
transformers modules are built those are millions that never become garbage. Such a collection
took 0.25-0.37 s here, every few steps of a 0.4 s llama-tiny step. :func:`freeze_setup_objects`
moves them out of the collector's reach once the first step has run (``gc.freeze``), and
:func:`release_setup_objects` gives them back when the run ends.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
_APPLIED: list[bool] = []
_FROZE: list[bool] = []  # freeze_setup_objects froze the collector's objects


def keep_freed_memory(enabled: bool = True) -> bool:
    """Sets glibc's malloc to keep freed memory (once per process). Returns whether it is set."""
    if not enabled or _APPLIED:
        return bool(_APPLIED and _APPLIED[0])
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    ok = all(libc.mallopt(param, value) == 1 for param, value in
             ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2 ** 31 - 1)))
    if not ok:
        log.warning("mallopt refused a setting: freed memory may still go back to the OS")
    _APPLIED.append(ok)
    return ok


def freeze_setup_objects() -> None:
    """Exempts every object alive now from later collections (``gc.freeze``). Called after a
    run's first step, when the models, optimizers and compiled graphs exist; objects made later
    are collected as before. Idempotent until :func:`release_setup_objects`.

    No collection first: a full collection runs finalizers (0.3 s of them here), and a Ctrl-C
    that lands in one is printed and dropped, so the run went on (tests/test_runtime_trainer.py
    caught it). Garbage alive at the freeze waits for the run's end instead."""
    if not _FROZE:
        gc.freeze()
        _FROZE.append(True)


def release_setup_objects() -> None:
    """Undoes :func:`freeze_setup_objects` at the end of a run, so what the run leaves behind
    (its models, once dropped) is collected again."""
    if _FROZE:
        gc.unfreeze()
        _FROZE.clear()
