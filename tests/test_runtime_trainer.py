"""`agentrt train` on Ray: the in-process results, and Ctrl-C leaves Ray down and a checkpoint
that resumes (here in-process: Ray and local checkpoints are the same format)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from agentrt.config.load import validate_config
from agentrt.workloads.prompts.workload import Trainer
from agentrt.workloads.prompts.config import TrainConfig

STEPS = 4


def config(run_dir: Path, model_dir: Path, **top) -> dict:
    return {
        "seed": 0, "run_dir": str(run_dir), "progress": False,
        "task": {"name": "arithmetic", "train_size": 200, "eval_size": 8},
        "policy": {"model": {"path": str(model_dir)}, "optim": {"lr": 1e-3},
                   "micro_batch_size": 8,
                   "algorithm": {"name": "grpo", "kl": {"coef": 0.01}, "mini_batches": 2},
                   "rollout": {"sampling": {"max_new_tokens": 4}}},
        "sft": {"steps": 1, "batch_size": 8},
        "train": {"steps": STEPS, "prompts_per_step": 4, "group_size": 4},
        "eval": {"every": 2}, "checkpoint": {"every": 1, "keep": 5}, **top,
    }


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").is_dir() and "(Z)" not in Path(f"/proc/{pid}/stat").read_text()[:64]


def session_processes(ray_tmp: str) -> list[int]:
    """Ray processes (gcs, raylet, agents) whose command line names this run's Ray temp dir."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and ray_tmp in (proc / "cmdline").read_text():
                found.append(int(proc.name))
        except OSError:
            continue
    return [pid for pid in found if alive(pid)]


def wait_for(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


def test_ray_run_matches_in_process_and_ctrl_c_leaves_a_resumable_checkpoint(
        tmp_path, tiny_model_dir):
    ray_dir, local_dir = tmp_path / "ray", tmp_path / "local"
    cfg_path = tmp_path / "ray.yaml"
    cfg_path.write_text(yaml.safe_dump(config(
        ray_dir, tiny_model_dir, runtime={"backend": "ray", "num_cpus": 1},
        train={"steps": 50, "prompts_per_step": 4, "group_size": 4})))
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths are limited
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    # A shell's background job (e.g. `make test &`) inherits SIGINT ignored, and Python keeps an
    # ignored SIGINT; restore the default so the child sees Ctrl-C as a foreground run does.
    proc = subprocess.Popen([sys.executable, "-m", "agentrt.cli", "train", str(cfg_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert wait_for(lambda: (ray_dir / "checkpoints" / "step_1").is_dir()
                        or proc.poll() is not None, 240), "no step-1 checkpoint"
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "interrupted at step" in err and "Traceback" not in err, err
    assert proc.returncode == 130 and "run the same command again to resume" in err
    pids = [int(p) for p in re.findall(r"\d+", re.search(r"workers up \(pids \[([\d, ]+)\]",
                                                           err).group(1))]
    assert wait_for(lambda: not any(alive(p) for p in pids), 30), "a Ray worker survived"
    assert wait_for(lambda: not session_processes(ray_tmp), 30), session_processes(ray_tmp)

    # Resume the Ray run's checkpoint in-process to STEPS; compare with an in-process run.
    done = max(int(p.name.split("_")[1]) for p in (ray_dir / "checkpoints").glob("step_*"))
    # Ctrl-C must have landed mid-run: at least one checkpoint, and not the finished run.
    assert 1 <= done < STEPS
    Trainer(validate_config(config(ray_dir, tiny_model_dir), TrainConfig)).run()
    Trainer(validate_config(config(local_dir, tiny_model_dir), TrainConfig)).run()
    a, b = rows(ray_dir), rows(local_dir)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(STEPS + 1))
    assert any("runtime/worker_restarts" in r for r in a[1:done + 1])  # came from the Ray pool
    for ra, rb in zip(a, b):
        for key, value in rb.items():
            if (key.startswith(("timing_s/", "perf/")) or key.endswith(("/latency_s", "/down_s"))
                    or key in ("time", "step")):
                continue  # how fast, how long and on how many threads: the machine, not the run
            # Ray workers run 1 torch thread, this process more: float sums may differ in the
            # last bits (rollout/logprob_diff ~1e-8); everything else is bit-equal in practice.
            assert ra[key] == pytest.approx(value, abs=1e-5), (ra["step"], key)
    assert (ray_dir / "final_model" / "config.json").is_file()
