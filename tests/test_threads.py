"""The default thread count: tuned on the policy's own forward pass, pinned by ``threads: N``."""

from __future__ import annotations

import ctypes
import os
import statistics
import subprocess
import sys
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrt.config.load import validate_config
from agentrt.runtime.threads import (ThreadTuner, apply_threads, candidates, forward_probe, runnable_now,
                             set_threads, spare_cpus, spare_from, usable_cpus)
from agentrt.workloads.prompts.workload import Trainer
from agentrt.workloads.prompts.config import TrainConfig
from test_trainer import rows, small_config  # also registers the test rewards


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_usable_cpus_is_within_the_affinity_mask():
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))
    assert candidates(1) == [1]
    assert candidates(2) == [1, 2]
    assert candidates(16) == [1, 8, 16]


def omp_max_threads() -> int:
    """The calling thread's OpenMP thread count, read from torch's own libgomp (other packages
    load theirs; torch's getters initialise the thread first, so they cannot show what a matmul
    would use)."""
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    path = next(line.split()[-1] for line in open("/proc/self/maps")
                if "libgomp" in line and line.split()[-1].startswith(torch_lib))
    return ctypes.CDLL(path).omp_get_max_threads()


def test_a_new_thread_takes_the_process_count_only_when_it_applies_it(restore_threads):
    set_threads(2)
    seen = {}

    def body(key, sharing):
        if sharing:
            apply_threads(sharing)
        seen[key] = omp_max_threads()

    for key, sharing in (("bare", 0), ("alone", 1), ("one of two", 2)):
        t = threading.Thread(target=body, args=(key, sharing))
        t.start()
        t.join()
    set_threads(1)
    t = threading.Thread(target=body, args=("after set 1", 1))
    t.start()
    t.join()
    # a bare thread has OpenMP's process default, whatever the main thread set
    assert seen["bare"] == int(os.environ.get("OMP_NUM_THREADS", os.cpu_count()))
    assert (seen["alone"], seen["one of two"], seen["after set 1"]) == (2, 1, 1)


@pytest.mark.parametrize("slow", [1, 2])
def test_tuner_keeps_the_faster_count(restore_threads, slow):
    """A probe that is slow on one thread count (as a contended core makes it) is not run there."""
    timed, now = [], [0.0]

    def piece():  # costs 30 units on the slow count, 1 on the other, whatever the machine does
        timed.append(torch.get_num_threads())
        now[0] += 30 if torch.get_num_threads() == slow else 1

    tuner = ThreadTuner([piece] * 4, cpus=2, every=5, rounds=2, clock=lambda: now[0])
    assert tuner.tune() == 3 - slow
    assert torch.get_num_threads() == 3 - slow
    assert tuner.last[slow] > tuner.last[3 - slow]
    if slow == 2:  # timed after the fast count: stopped after its first piece, in one round
        assert timed.count(2) == 1
    assert tuner.maybe_tune(4) == 3 - slow  # before the next check: no timing
    assert tuner.gap == 5
    tuner.maybe_tune(5)  # the same answer: the next check comes twice as late
    assert (tuner.gap, tuner.next_at) == (10, 15)


@pytest.mark.parametrize("cost_of_2", [1.0, 0.95, 0.85])
def test_fewer_threads_unless_more_are_faster_by_the_margin(restore_threads, cost_of_2):
    now = [0.0]

    def piece():
        now[0] += cost_of_2 if torch.get_num_threads() == 2 else 1.0

    tuner = ThreadTuner([piece], cpus=2, rounds=1, margin=0.1, clock=lambda: now[0])
    assert tuner.tune() == (2 if cost_of_2 * 1.1 < 1.0 else 1)


@pytest.mark.parametrize("spare", [0.3, 1.2, 1.6, 2.0])
def test_more_threads_are_timed_only_when_spare_cpus_fit_them(restore_threads, spare):
    """On a busy machine the default is one thread with nothing timed (the probe's cost made it
    slower than threads=1); with a CPU spare both counts are timed and the faster one kept."""
    timed, now = [], [0.0]

    def piece():  # 2 threads twice as fast, as on an idle machine
        timed.append(torch.get_num_threads())
        now[0] += 0.5 if torch.get_num_threads() == 2 else 1.0

    tuner = ThreadTuner([piece], cpus=2, rounds=2, clock=lambda: now[0], spare=lambda: spare)
    if spare < 1.5:
        assert (tuner.tune(), timed, tuner.last) == (1, [], {1: 0.0})
        assert torch.get_num_threads() == 1
    else:
        assert tuner.tune() == 2 and set(timed) == {1, 2}


@pytest.mark.parametrize("load, torch_threads, runnable, spare", [
    (0.2, 1, [(1, 1)] * 5, 2.0),  # idle: only the reading thread runs
    (0.8, 1, [(2, 1)] * 5, 1.0),  # a neighbour started seconds ago: the load average lags
    (1.9, 1, [(1, 1)] * 5, 2.0),  # one that just ended (the run before): the average still
    (2.1, 2, [(3, 3)] * 5, 2.0),  # counts it, the runnable tasks do not; nor our own threads
    (0.2, 1, [(1, 1), (3, 1), (1, 1), (2, 1), (1, 1)], 2.0),  # wake-ups in two samples of five
    (0.2, 1, [(2, 1), (2, 1), (1, 1), (2, 1), (3, 2)], 1.0),  # a neighbour in most samples
    (2.0, 1, [], 1.0),  # no /proc (not Linux): the load average, our own threads out
    (2.9, 2, [], 1.1),
    (None, 1, [], 2.0),  # nothing known: all of them
])
def test_spare_cpus_are_what_the_runnable_tasks_now_leave_free(
        load, torch_threads, runnable, spare):
    assert spare_from(2, load, torch_threads, runnable) == pytest.approx(spare)


def test_spare_cpus_sees_a_process_that_started_a_moment_ago():
    """The real readers: a spinning neighbour is a runnable task at once, and this process's
    reading thread is not another process."""
    spinner = subprocess.Popen([sys.executable, "-c", "print(flush=True)\nwhile True: pass"],
                               stdout=subprocess.PIPE)
    try:
        spinner.stdout.readline()  # it runs
        samples = [runnable_now() for _ in range(5)]
        spare = spare_cpus()
    finally:
        spinner.kill()
        spinner.wait()
    assert all(own >= 1 and runnable >= own for runnable, own in samples)
    assert statistics.median(runnable - own for runnable, own in samples) >= 1
    assert spare <= usable_cpus() - 1


def test_the_watch_drops_to_one_thread_when_the_cpus_are_taken_two_steps_in_a_row(
        restore_threads):
    timed, now, seen = [], [0.0], iter([1.0, 2.0, 1.0, 1.0])  # spare CPUs at steps 1-4

    def piece():  # 2 threads twice as fast, as on an idle machine
        timed.append(torch.get_num_threads())
        now[0] += 0.5 if torch.get_num_threads() == 2 else 1.0

    tuner = ThreadTuner([piece], cpus=2, every=10, rounds=1, clock=lambda: now[0],
                        spare=lambda: 2.0, watch=lambda: next(seen))
    assert tuner.tune() == 2
    timed.clear()
    # one crowded step, then a clear one, then two crowded ones: one thread, untimed
    assert [tuner.maybe_tune(step) for step in range(1, 5)] == [2, 2, 2, 1]
    assert torch.get_num_threads() == 1 and timed == []
    assert (tuner.gap, tuner.next_at) == (10, 14)
    assert [tuner.maybe_tune(step) for step in range(5, 14)] == [1] * 9  # no watch on 1 thread
    assert tuner.maybe_tune(14) == 2 and set(timed) == {1, 2}  # the check times both again


def test_probe_leaves_the_model_and_rng_as_they_were(restore_threads, tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    ThreadTuner(forward_probe(model, 64, batch=2, length=4, decode_steps=2), rounds=1).tune()
    assert model.training
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_thread_count_does_not_change_a_training_step(restore_threads, tiny_model_dir):
    """What the tuner may change is only speed: logits and gradients are bit-equal on 1 and 2
    threads for the model sizes the tests train."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.randint(0, 200, (8, 24), generator=torch.Generator().manual_seed(0))
    out = []
    for n in (1, 2):
        torch.set_num_threads(n)
        model.zero_grad()
        logits = model(ids).logits
        logits.log_softmax(-1).mean().backward()
        out.append((logits.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    assert torch.equal(out[0][0], out[1][0])
    assert torch.equal(out[0][1], out[1][1])


def test_a_run_without_threads_is_tuned_and_one_with_threads_is_pinned(restore_threads, tmp_path,
                                                                       tiny_model_dir):
    auto = Trainer(validate_config(small_config(tmp_path / "auto", tiny_model_dir,
                                                **{"train.steps": 2}), TrainConfig))
    auto.run()
    # 2 threads are timed only where spare_cpus leaves a CPU for them (test_spare_cpus_...)
    assert auto.controller.tuner is not None and set(auto.controller.tuner.last) in ({1}, {1, 2})
    # the per-step watch may drop a timed choice to 1 thread when a neighbour crowds the CPUs
    used = [r["perf/threads"] for r in rows(tmp_path / "auto")[1:]]
    assert len(used) == 2 and used[-1] == float(auto.controller.tuner.threads)
    assert set(used) <= {1.0, 2.0} and used == sorted(used, reverse=True)

    pinned = Trainer(validate_config(small_config(tmp_path / "pinned", tiny_model_dir,
                                                  **{"train.steps": 2, "threads": 1}), TrainConfig))
    pinned.run()
    assert pinned.controller.tuner is None
    assert [r["perf/threads"] for r in rows(tmp_path / "pinned")[1:]] == [1.0, 1.0]
