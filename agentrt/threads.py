"""How many torch threads a run uses when its config leaves ``threads`` unset.

torch starts with one intra-op thread per core it sees. On a machine whose cores other processes
also use (a shared 2-core box, a Ray worker beside the driver, a second run) that is the worst
choice: every parallel region waits for the thread the OS descheduled, and small ops (a decode
step, a LoRA matmul) run several times slower than on one thread. Measured here with one core
busy: a 64x256 matmul 2-4x slower on 2 threads than on 1; a whole GRPO step up to 10-30x.

So the default is *tuned*: :class:`ThreadTuner` times the policy's own forward pass (one
prompt-sized batch and a few decode-sized ones) on each candidate thread count (1, half and all
of :func:`usable_cpus`), interleaved over a few rounds, keeps the fastest (fewer threads unless
more are clearly faster), and checks again every ``every`` steps because contention comes and
goes. ``threads: N`` in a config pins N and tunes nothing. The choice never changes the
numbers a step computes beyond what torch's kernels guarantee across thread counts (for the
model sizes tested, bit-equal: tests/test_threads.py).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

log = logging.getLogger(__name__)

_STATE = {"auto": True}


def set_threads(threads: int | None) -> None:
    """``threads`` pins torch's thread count; None leaves it to :class:`ThreadTuner`."""
    _STATE["auto"] = not threads
    torch.set_num_threads(threads or usable_cpus())


def threads_auto() -> bool:
    """Whether the run's config left ``threads`` unset (the controller then tunes it)."""
    return _STATE["auto"]


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def candidates(cpus: int) -> list[int]:
    """Thread counts worth timing: 1, half and all of ``cpus``."""
    return sorted({1, max(1, cpus // 2), cpus})


def forward_probe(model: nn.Module, vocab: int, batch: int = 16, length: int = 32,
                  decode_steps: int = 8) -> Callable[[], None]:
    """A probe of ``model``'s own cost: one (batch, length) forward, as training and prefill
    do, and ``decode_steps`` (2*batch, 1) forwards, as token-by-token generation does. Draws no
    global random numbers and leaves the model's train/eval mode as it was."""
    gen = torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    prefill = torch.randint(0, vocab, (batch, length), generator=gen).to(device)
    decode = torch.randint(0, vocab, (2 * batch, 1), generator=gen).to(device)

    def probe() -> None:
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                model(input_ids=prefill)
                for _ in range(decode_steps):
                    model(input_ids=decode)
        finally:
            model.train(was_training)

    return probe


class ThreadTuner:
    """Picks the fastest thread count for ``probe`` now, and again every ``every`` steps.

    Args:
        probe: The work to time (:func:`forward_probe` of the run's first policy).
        cpus: The most threads to try (default :func:`usable_cpus`).
        every: Steps between checks (0: only at the start).
        rounds: Interleaved timing rounds per check; each candidate keeps its best time.
        margin: More threads must be this much faster to be chosen (they lose more to a
            neighbour that starts later).
    """

    def __init__(self, probe: Callable[[], None], cpus: int | None = None, every: int = 25,
                 rounds: int = 3, margin: float = 0.1) -> None:
        self.probe, self.every, self.rounds, self.margin = probe, every, rounds, margin
        self.candidates = candidates(cpus or usable_cpus())
        self.threads = torch.get_num_threads()
        self.last: dict[int, float] = {}

    def tune(self) -> int:
        """Times every candidate, sets and returns the winner."""
        if len(self.candidates) == 1:
            self.threads = self.candidates[0]
            torch.set_num_threads(self.threads)
            return self.threads
        self.probe()  # warm-up: first-call allocations and kernel selection
        best = {n: float("inf") for n in self.candidates}
        for r in range(self.rounds):
            order = self.candidates if r % 2 == 0 else self.candidates[::-1]
            for n in order:
                torch.set_num_threads(n)
                t0 = time.perf_counter()
                self.probe()
                best[n] = min(best[n], time.perf_counter() - t0)
        choice = self.candidates[0]
        for n in self.candidates[1:]:
            if best[n] * (1 + self.margin) < best[choice]:
                choice = n
        torch.set_num_threads(choice)
        if choice != self.threads:
            log.info("torch threads: %d (%s)", choice,
                     ", ".join(f"{n}: {best[n] * 1e3:.0f} ms" for n in self.candidates))
        self.threads, self.last = choice, best
        return choice

    def maybe_tune(self, step: int) -> int:
        """Tunes again when ``step`` is a multiple of ``every``."""
        if self.every and step % self.every == 0:
            return self.tune()
        return self.threads
