"""Prompts from a Redis stream (agentrt.workloads.prompts.data.redis_stream) against a real redis-server: every
prompt trained on exactly once across a SIGKILL and a restart, the acknowledgement protocol
step by step, finished episodes sent on, and a dead Redis as one line."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from agentrt.core.types import GroupKey, Trajectory, Turn
from agentrt.workloads.prompts.config import TaskConfig
from agentrt.workloads.prompts.data import open_source
from agentrt.workloads.prompts.data.sources import PromptDataError
from test_cli_check import run_cli

ROOT = Path(__file__).resolve().parents[1]


def push(client: redis.Redis, stream: str, n: int, start: int = 0) -> list[str]:
    """``n`` prompts 'i+1=' (answer i+1, extra column 'tol'); returns their entry ids."""
    pipe = client.pipeline(transaction=False)
    for i in range(start, start + n):
        pipe.xadd(stream, {"prompt": f"{i}+1=", "answer": str(i + 1), "tol": "0"})
    return [x.decode() for x in pipe.execute()]


def options(url: str, **over: Any) -> dict[str, Any]:
    return {"redis": {"url": url}, "stream": "prompts", "episodes_stream": "episodes",
            "columns": {"prompt": "prompt", "answer": "answer", "extra": ["tol"]}, **over}


def sink(client: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(f[b"json"]) for _, f in client.xrange("episodes")]


def played(index: int) -> Trajectory:
    """A played one-turn episode of prompt ``index`` as the runner makes it (task 'ex<i>')."""
    turn = Turn([1], [2], [0.0], reward=1.0, info={"action": "x"})
    return Trajectory([turn], group_id=GroupKey("Task-v0", "agent_0", "policy", task=f"ex{index}"))


def test_acknowledged_only_once_no_kept_checkpoint_needs_it(redis_server) -> None:
    """Read, checkpointed, killed, and the newest checkpoint found damaged: an entry is
    acknowledged (its episode sent on) only once the oldest kept checkpoint trained on it, so a
    resume from the checkpoint before reads the lost step's entries again, in order, and
    every episode is sent on exactly once (issue 41, finding 3: they had been acknowledged with
    the damaged checkpoint, and the replay trained on new entries instead)."""
    client = redis.Redis.from_url(redis_server.url)
    ids = push(client, "prompts", 40)
    task = TaskConfig(name="redis", options=options(redis_server.url))
    first = open_source(task, seed=0)
    step1 = first.next(10)
    assert step1[0].info == {"answer": "1", "tol": "0"} and step1[0].prompt == "0+1="
    first.finished([played(i) for i in range(10)], 1)
    state1 = json.loads(json.dumps(first.state_dict()))
    first.checkpointed(1, oldest=1)  # the only checkpoint: what it trained on is delivered
    assert [e["prompt_id"] for e in sink(client)] == ids[:10]
    step2 = [ex.prompt for ex in first.next(7)]
    first.finished([played(i) for i in range(7)], 2)
    state2 = json.loads(json.dumps(first.state_dict()))
    first.checkpointed(2, oldest=1)  # checkpoint 1 is kept: step 2's entries stay pending
    assert client.xpending("prompts", "agentrt")["pending"] == 7 and len(sink(client)) == 10
    step3 = [ex.prompt for ex in first.next(5)]  # step 3 read, then killed

    # checkpoint 2 is damaged: the resume falls back to checkpoint 1 and replays steps 2 and 3
    again = open_source(task, seed=0)
    again.load_state_dict(state1)
    assert [ex.prompt for ex in again.next(7)] == step2
    again.finished([played(i) for i in range(7)], 2)
    again.checkpointed(2, oldest=1)
    # step 3: its 5 entries again, then new ones
    assert [ex.prompt for ex in again.next(8)] == step3 + ["22+1=", "23+1=", "24+1="]
    again.finished([played(i) for i in range(8)], 3)
    state3 = json.loads(json.dumps(again.state_dict()))
    again.checkpointed(3, oldest=2)  # checkpoint 1 pruned: step 2's entries are delivered
    assert [e["prompt_id"] for e in sink(client)] == ids[:17]
    assert client.xpending("prompts", "agentrt")["pending"] == 8

    # killed before the acknowledgement of a checkpoint it kept: the resume skips what that
    # checkpoint trained on (delivered later, once) and reads what came after it
    late = [ex.prompt for ex in again.next(2)]
    third = open_source(task, seed=0)
    third.load_state_dict(state3)
    assert [ex.prompt for ex in third.next(2)] == late
    third.checkpointed(4, oldest=4)
    assert [e["prompt_id"] for e in sink(client)] == ids[:25]  # step 3's, once
    assert client.xpending("prompts", "agentrt")["pending"] == 0

    # a resume from checkpoint 1 again (the newer ones lost): steps 2-4's prompts are gone
    # (acknowledged), so it refuses in one line where it would wait for prompts forever
    lost = open_source(task, seed=0)
    with pytest.raises(PromptDataError, match="the prompts of steps 2-4 were acknowledged"):
        lost.load_state_dict(state1)
    fourth = open_source(task, seed=0)  # the same checkpoint in another run folder: its own
    fourth.owner = "another run folder"
    fourth.load_state_dict(state1)
    assert len(sink(client)) == 25 and client.xpending("prompts", "agentrt")["pending"] == 0
    assert [ex.prompt for ex in fourth.next(2)] == ["27+1=", "28+1="]
    client.xadd("prompts", {"prompt": "", "answer": "1", "tol": "0"})  # empty prompt: skipped
    client.xadd("prompts", {"json": json.dumps({"prompt": "j=", "answer": 7, "tol": 1})})
    got = fourth.next(12)
    assert got[-1].prompt == "j=" and got[-1].info == {"answer": "7", "tol": 1}
    assert fourth.metrics()["data/skipped_rows"] == 1


def test_a_checkpoint_of_the_earlier_protocol_resumes(redis_server) -> None:
    """A checkpoint written before held groups (``unacked``/``outbox``): its entries still
    pending are not read again and are delivered with the next checkpoint."""
    client = redis.Redis.from_url(redis_server.url)
    ids = push(client, "prompts", 12)
    task = TaskConfig(name="redis", options=options(redis_server.url))
    first = open_source(task, seed=0)
    first.next(4)
    old = {"unacked": ids[:4], "outbox": [{"prompt_id": i, "step": 1} for i in ids[:4]],
           "read": 4, "skipped": {}}
    first.next(3)
    again = open_source(task, seed=0)
    again.load_state_dict(old)
    assert [ex.prompt for ex in again.next(3)] == ["4+1=", "5+1=", "6+1="]
    again.checkpointed(2, oldest=2)
    assert [e["prompt_id"] for e in sink(client)] == ids[:4]
    assert client.xpending("prompts", "agentrt")["pending"] == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_redis_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    cfg = {"task": {"name": "redis", "options": options(f"redis://127.0.0.1:{free_port()}/0")},
           "policy": {"model": {"preset": "llama-nano"}}, "run_dir": str(tmp_path / "run")}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    for command in ("check-config", "train"):
        code, out, err = run_cli(monkeypatch, capsys, command, str(path))
        assert code == 2, (out, err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: Redis at redis://127.0.0.1:"), err
        assert "task.options.redis.url" in lines[0] and "Traceback" not in err
        assert not (tmp_path / "run").exists()
    with pytest.raises(PromptDataError, match="did not answer"):  # the source itself, too
        open_source(TaskConfig(name="redis", options=cfg["task"]["options"]), seed=0)


def test_redis_going_down_mid_run_is_one_error(redis_server) -> None:
    client = redis.Redis.from_url(redis_server.url)
    push(client, "prompts", 5)
    source = open_source(TaskConfig(name="redis", options=options(redis_server.url)), seed=0)
    assert len(source.next(3)) == 3
    redis_server.stop()
    with pytest.raises(PromptDataError, match="redis stream 'prompts' at redis://127.0.0.1:.*"
                                              "the last checkpoint is resumable"):
        source.next(2)


def test_every_prompt_trained_once_across_a_sigkill(redis_server, tmp_path: Path) -> None:
    """Must-show 2: 10,000 prompts pushed while `agentrt train` runs; it is killed with SIGKILL
    once, mid-run, its newest checkpoint is then found damaged (zero-filled), and it is
    restarted: it falls back to the checkpoint before, and the run's records (the episodes it
    sent on, one per prompt, and its metrics rows) name every prompt exactly once, and none is
    left pending (issue 41, finding 3: the damaged checkpoint's prompts had been acknowledged,
    so they were never trained and the run waited for prompts that never came)."""
    client = redis.Redis.from_url(redis_server.url)
    ids = push(client, "prompts", 4000)
    cfg = {"seed": 0, "run_dir": str(tmp_path / "run"), "progress": False, "threads": 1,
           "task": {"name": "redis", "options": options(redis_server.url, wait_s=60)},
           "reward": "exact_match",
           "policy": {"model": {"preset": "llama-nano"}, "micro_batch_size": 2000,
                      "rollout": {"sampling": {"max_new_tokens": 1}, "batch_size": 2000}},
           "train": {"steps": 5, "prompts_per_step": 2000, "group_size": 1},
           "eval": {"every": 1000}, "checkpoint": {"every": 1}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    command = [sys.executable, "-m", "agentrt.cli", "train", str(path)]
    metrics = tmp_path / "run" / "metrics.jsonl"
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    ids += push(client, "prompts", 6000, start=4000)  # the rest arrives while it runs
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:  # step 2 logged
            break
        time.sleep(0.05)
    time.sleep(random.Random(0).uniform(0.0, 0.5))  # somewhere inside step 3
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(metrics.read_text().splitlines()) - 1
    newest = max((tmp_path / "run" / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
    state = newest / "state.pt"
    state.write_bytes(bytes(state.stat().st_size))  # zero-filled: its checksum fails
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert 2 <= killed_at < 5, killed_at
    assert f"{newest.name}" in done.stderr and "does not match its checksum" in done.stderr
    trained = Counter(e["prompt_id"] for e in sink(client))
    assert set(trained) == set(ids) and set(trained.values()) == {1}
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6))
    assert sum(r.get("data/stream_prompts", 0) for r in rows) == 10_000
    assert client.xpending("prompts", "agentrt")["pending"] == 0
    assert not any("eval/accuracy" in r for r in rows)  # no held-out split: no evaluation
