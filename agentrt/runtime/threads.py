"""How many torch threads a run uses when its config leaves ``threads`` unset.

torch starts with one intra-op thread per core it sees. On a machine whose cores other processes
also use (a shared 2-core box, a Ray worker beside the driver, a second run) that is the worst
choice: every parallel region waits for the thread the OS descheduled, and small ops (a decode
step, a LoRA matmul) run several times slower than on one thread. Measured here with one core
busy: a 64x256 matmul 2-4x slower on 2 threads than on 1; a whole GRPO step up to 10-30x.

So the default is *tuned*: a run starts on one thread (building the model never pays for
contention), then :class:`ThreadTuner` times the policy's own forward pass (one prompt-sized
batch and a few decode-sized ones) on each candidate thread count (1, half and all of
:func:`usable_cpus`), interleaved over a few rounds, keeps the fastest (fewer threads unless
more are clearly faster) and checks again later, because contention comes and goes: after
``every`` steps, then twice as long each time the answer stays the same (at most 8x), back to
``every`` when it changes. A candidate more than twice as slow as the best is timed once per
check, not every round: on a contended core it is the expensive one to time (measured here
under load 9: 8.6 s for 2 threads against 0.4 s for 1). ``threads: N`` in a config pins N and
tunes nothing.

The default aims never to be slower than ``threads: 1`` (bench/threads.py prints both). One
thread is the start and the fallback; more are chosen only when measured faster by ``margin`` on the
model's own forward. What remains is the timing itself, and on a busy machine that was the whole
difference: with the other cores' load average at 7 the tuner chose 1 thread, yet the default ran
0.95x the steps/s of ``threads: 1`` over 12 GRPO steps, the probe's cost. So a check times more
threads only where other processes leave a core for them (:func:`spare_cpus`: the tasks runnable
now, this process's own threads taken out); on a busy machine the default *is* one thread, with
nothing timed. The 1-minute load average (read only where /proc is missing) lags both ways: a
neighbour started seconds before the run was not in it, the first check timed 2 threads on its
core and the default ran 0.95x in bench/threads.py's "one core busy"; and a run that ended
seconds before stayed in it, so the next run of a sweep or benchmark started on one thread of an
idle machine until its next check. The runnable tasks show both at once, and with a neighbour
the default now times nothing (measured under load 1-7: one thread, untimed,
the same CPU seconds per step as ``threads: 1``, a 45 ms start check; the steps/s ratios, 0.86-
1.01x, moved as much between identical arms: docs/performance.md). A neighbour that starts
after a check chose more threads is seen by the per-step watch: one thread after two crowded
steps, where the check gap (up to ``8 * every`` steps) alone left up to 200 steps on a contended
core.

The count is per thread: OpenMP keeps it per OS thread, and ``torch.set_num_threads`` in the
main thread leaves every other thread at the process default of one per core. A thread that
runs torch ops (the controller's pool threads, the server's batcher) calls
:func:`apply_threads` first; without it, a new thread's matmuls ran 38x slower than the main
thread's here under load (the 10-30x a GRPO step lost with the old default). The choice never
changes the numbers a step computes beyond what torch's kernels guarantee across thread counts
(for the model sizes tested, bit-equal: tests/test_threads.py).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from agentrt.core.device import module_device

log = logging.getLogger(__name__)

_STATE = {"auto": True, "threads": 1}


def set_threads(threads: int | None) -> None:
    """``threads`` pins torch's thread count; None leaves it to :class:`ThreadTuner`."""
    _STATE["auto"] = not threads
    _use(threads or 1)


def _use(threads: int) -> None:
    _STATE["threads"] = threads
    torch.set_num_threads(threads)


def apply_threads(sharing: int = 1) -> int:
    """Gives the calling thread the process's thread count, divided among ``sharing`` threads
    that compute at the same time. Returns the count set."""
    n = max(1, _STATE["threads"] // max(1, sharing))
    torch.set_num_threads(n)
    return n


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


def spare_from(cpus: int, load: float | None, torch_threads: int,
               runnable: Sequence[tuple[int, int]]) -> float:
    """CPUs other processes leave free now.

    Args:
        cpus: CPUs this process may run on (:func:`usable_cpus`).
        load: The 1-minute load average (None where unknown), read only where there are no
            ``runnable`` samples; this process's ``torch_threads`` are taken out of it. It lags
            both ways: a neighbour that started seconds ago is barely in it, and one that ended
            (the previous run of a sweep, the ``pip install`` before a demo) stays in it for
            a minute.
        torch_threads: This process's torch thread count.
        runnable: Samples taken a few ms apart of (tasks runnable system-wide, this process's
            runnable threads), as ``/proc/loadavg`` and ``/proc/self/task`` show them now (none
            where there is no /proc). Their median, less this process, is the other processes'
            runnable tasks now: a job that holds a core is runnable in every sample, and one
            wake-up of a short task in one sample does not count.
    """
    if runnable:
        others = statistics.median(r - own for r, own in runnable)
    elif load is not None:
        others = load - torch_threads
    else:
        others = 0.0
    return cpus - max(0.0, others)


def runnable_now() -> tuple[int, int] | None:
    """(Tasks runnable system-wide, of them this process's threads) now; None without /proc."""
    try:
        runnable = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None
    own = 0
    for task in Path("/proc/self/task").iterdir():
        try:  # "pid (comm) state ...": the state follows the last ")"
            own += task.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            pass  # the thread ended
    return runnable, own


def spare_cpus(samples: int = 5, gap: float = 0.01) -> float:
    """CPUs other processes leave free now (:func:`spare_from`), from ``samples`` reads of the
    runnable tasks ``gap`` seconds apart (one read: the per-step watch of :class:`ThreadTuner`,
    about 0.02 ms); from the 1-minute load average where there is no /proc."""
    try:
        load: float | None = os.getloadavg()[0]
    except OSError:  # not available on this platform
        load = None
    runnable = []
    for i in range(samples):
        if i:
            time.sleep(gap)
        if (now := runnable_now()) is None:
            break
        runnable.append(now)
    return spare_from(usable_cpus(), load, torch.get_num_threads(), runnable)


Probe = Sequence[Callable[[], None]]  # pieces of work, timed together, stoppable between


def forward_probe(model: nn.Module, vocab: int, batch: int = 16, length: int = 32,
                  decode_steps: int = 8) -> Probe:
    """A probe of ``model``'s own cost: ``decode_steps`` (2*batch, 1) forwards, as
    token-by-token generation does, then one (batch, length) forward, as training and prefill
    do; each forward one piece. Draws no global random numbers and leaves the model's
    train/eval mode as it was."""
    gen = torch.Generator().manual_seed(0)
    device = module_device(model)
    prefill = torch.randint(0, vocab, (batch, length), generator=gen).to(device)
    decode = torch.randint(0, vocab, (2 * batch, 1), generator=gen).to(device)

    def forward(ids: torch.Tensor) -> Callable[[], None]:
        def piece() -> None:
            was_training = model.training
            model.eval()
            try:
                with torch.inference_mode():
                    model(input_ids=ids)
            finally:
                model.train(was_training)
        return piece

    return [forward(decode)] * decode_steps + [forward(prefill)]


class ThreadTuner:
    """Picks the fastest thread count for ``probe`` now, and again later.

    A candidate's timing stops between two pieces of the probe once it took twice the best
    whole probe so far: a contended thread count costs little more than the winner to rule out.

    Args:
        probe: The work to time (:func:`forward_probe` of the run's first policy).
        cpus: The most threads to try (default :func:`usable_cpus`).
        every: Steps to the first check after the start (0: only at the start); the gap
            doubles while the answer stays the same, up to ``8 * every``.
        rounds: Interleaved timing rounds per check; each candidate keeps its best time.
        margin: More threads must be this much faster to be chosen (they lose more to a
            neighbour that starts later).
        clock: Seconds now (the tests count work instead of timing it).
        spare: CPUs free for this process now (:func:`spare_cpus`); a check times only the
            candidates that fit (rounded to the nearest CPU; one thread always). None: all.
        watch: A cheaper ``spare`` read at every step between checks while more than one
            thread runs (``spare_cpus(samples=1)``): when the threads do not fit at two steps
            in a row, one thread at once, untimed, and a check ``every`` steps later; a
            neighbour that starts after a check then costs two steps, not up to ``8 * every``.
            None: no watch.
    """

    def __init__(self, probe: Probe, cpus: int | None = None, every: int = 25,
                 rounds: int = 3, margin: float = 0.1,
                 clock: Callable[[], float] = time.perf_counter,
                 spare: Callable[[], float] | None = None,
                 watch: Callable[[], float] | None = None) -> None:
        self.probe, self.every, self.rounds, self.margin = probe, every, rounds, margin
        self.clock, self.spare, self.watch = clock, spare, watch
        self.crowded = 0  # steps in a row at which the watch saw the threads not fit
        self.candidates = candidates(cpus or usable_cpus())
        self.threads = torch.get_num_threads()
        self.last: dict[int, float] = {}
        self.gap, self.next_at = every, every

    def tune(self) -> int:
        """Times every candidate that the spare CPUs fit, sets and returns the winner."""
        room = round(self.spare()) if self.spare is not None else self.candidates[-1]
        fits = [n for n in self.candidates if n <= room] or self.candidates[:1]
        best = self._best(fits) if len(fits) > 1 else {fits[0]: 0.0}  # nothing to compare
        choice = fits[0]
        for n in fits[1:]:
            if best[n] * (1 + self.margin) < best[choice]:
                choice = n
        _use(choice)
        if self.last:  # a later check: back off while the answer holds
            self.gap = min(2 * self.gap, 8 * self.every) if choice == self.threads else self.every
        if choice != self.threads:
            log.info("torch threads: %d (%s)", choice,
                     ", ".join(f"{n}: {t * 1e3:.0f} ms" for n, t in best.items()))
        self.threads, self.last = choice, best
        return choice

    def _best(self, candidates: list[int]) -> dict[int, float]:
        """Each candidate's best time over the interleaved rounds."""
        torch.set_num_threads(candidates[0])
        self._time(float("inf"))  # warm-up: first-call allocations and kernel selection
        best = {n: float("inf") for n in candidates}
        for r in range(self.rounds):
            for n in candidates if r % 2 == 0 else candidates[::-1]:
                limit = 2 * min(best.values())
                if r and best[n] > limit:
                    continue  # clearly slower: once is enough
                torch.set_num_threads(n)
                best[n] = min(best[n], self._time(limit))
        return best

    def _time(self, limit: float) -> float:
        """Seconds of the whole probe, or of its first pieces once they exceed ``limit``."""
        t0 = self.clock()
        for piece in self.probe:
            piece()
            if self.clock() - t0 > limit:
                break
        return self.clock() - t0

    def maybe_tune(self, step: int) -> int:
        """Tunes again when ``step`` reaches the next check; between checks, the watch."""
        if self.every and step >= self.next_at:
            self.tune()
            self.next_at = step + self.gap
            self.crowded = 0
        elif self.watch is not None and self.threads > 1:
            self.crowded = self.crowded + 1 if round(self.watch()) < self.threads else 0
            if self.crowded == 2:
                log.info("torch threads: 1 (other processes took the CPUs)")
                _use(1)
                self.threads, self.crowded = 1, 0
                self.gap, self.next_at = self.every, step + self.every
        return self.threads
