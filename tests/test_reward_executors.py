"""Reward executors (agentrt.rewards): pooled Python functions with a per-call timeout, a real
HTTP reward service (examples/reward_server.py) killed and restarted mid-run, a learned reward
model trained by examples/train_reward_model.py, weighted sums, and the bad-input lines."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from agentrt.config.load import validate_config
from agentrt.workloads.prompts.config import TrainConfig
from agentrt.core.errors import ConfigError
from agentrt.controller.guards import RunStopped
from agentrt.rewards.executors import Sample, build_executor
from agentrt.rewards.sources import check_reward, parse_reward
from agentrt.rewards.model import encode
from agentrt.envs.tasks import make_splits
from agentrt.workloads.prompts.workload import Trainer

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "examples" / "reward_server.py"
PROMPTS, GROUP, STEPS = 4, 2, 8

SLOW = """
import time

def slow(prompt, response, info):
    if response == "stuck":
        time.sleep(60)
    time.sleep(0.02)
    return float(len(response)) + 0.5 * float(info["answer"] == response)


def length_or_raise(prompt, response, info):
    if response == "boom":
        raise RuntimeError("boom")
    return float(len(response))
"""


def _samples(n: int) -> list[Sample]:
    return [Sample(f"s1-{i}", f"{i}+1=", str(i + (i % 3 == 0)), {"answer": str(i + 1)})
            for i in range(n)]


@pytest.fixture
def slow_module(tmp_path, monkeypatch):
    (tmp_path / "slow_rewards.py").write_text(SLOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "slow_rewards:slow"


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_pooled_python_reward_equals_serial_and_a_stuck_call_times_out(slow_module, pool):
    samples = _samples(12)
    serial = build_executor(parse_reward({"python": slow_module}))
    pooled = build_executor(parse_reward({"python": slow_module, "workers": 4, "pool": pool,
                                          "timeout_s": 5}))
    try:
        want, want_errors, _ = serial.score_batch(samples)
        got, errors, metrics = pooled.score_batch(samples)
        assert got == want and errors == want_errors == [None] * 12
        assert want[:2] == [1.0 + 0.5, 1.0]  # len('1') + exact match, len('1')
        assert metrics["reward/slow/errors"] == 0.0 and metrics["reward/slow/latency_s"] > 0
        stuck = [*samples[:3], Sample("s1-x", "p", "stuck", {"answer": "1"}), *samples[3:6]]
        quick = build_executor(parse_reward({"python": slow_module, "workers": 2, "pool": pool,
                                             "timeout_s": 1}))
        try:
            values, errors, metrics = quick.score_batch(stuck)
            assert errors[3] == "timed out after 1 s" and values[3] == 0.0
            assert [e for i, e in enumerate(errors) if i != 3] == [None] * 6
            assert values[:3] + values[4:] == want[:6]
            assert metrics["reward/slow/errors"] == 1.0
            again, errors, _ = quick.score_batch(samples[:4])  # the pool works after a timeout
            assert again == want[:4] and errors == [None] * 4
        finally:
            quick.close()
    finally:
        serial.close()
        pooled.close()


def test_weighted_sum_fails_a_sample_failed_in_any_source(slow_module):
    executor = build_executor(parse_reward([
        {"python": "exact_match", "weight": 0.7},
        {"python": "slow_rewards:length_or_raise", "weight": 0.25}]))
    values, errors, metrics = executor.score_batch([
        Sample("a", "1+1=", "2", {"answer": "2"}), Sample("b", "1+2=", "4", {"answer": "3"}),
        Sample("c", "1+3=", "boom", {"answer": "4"})])
    assert values == [0.7 + 0.25, 0.25, 0.0]
    assert errors[:2] == [None, None] and "boom" in errors[2]
    assert metrics["reward/exact_match/errors"] == 0.0
    assert metrics["reward/length_or_raise/errors"] == 1.0


# ----------------------------------------------------------------------------- HTTP service
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(port: int, journal: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(SERVER), "--port", str(port), "--journal",
                             str(journal)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    line = proc.stdout.readline()
    assert "listening" in line, line
    return proc


def _config(tmp_path: Path, model_dir: Path, reward, steps: int = STEPS, **extra) -> TrainConfig:
    return validate_config({
        "run_dir": str(tmp_path / "run"), "progress": False, "threads": 1, "reward": reward,
        "task": {"name": "arithmetic", "train_size": 64, "eval_size": 4},
        "policy": {"model": {"path": str(model_dir)}, "optim": {"lr": 1e-3},
                   "rollout": {"sampling": {"max_new_tokens": 3}}},
        "train": {"steps": steps, "prompts_per_step": PROMPTS, "group_size": GROUP},
        "eval": {"every": 100}, "checkpoint": {"every": 1}, **extra}, TrainConfig)


@pytest.fixture(scope="module")
def nano_dir(tmp_path_factory):
    from agentrt.policies.models import build_model

    return build_model(tmp_path_factory.mktemp("nano") / "m", "llama-nano", seed=0)


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_reward_service_killed_and_restarted_mid_run_loses_and_repeats_nothing(tmp_path,
                                                                              nano_dir):
    port, journal = _free_port(), tmp_path / "scores.jsonl"
    server = [_start_server(port, journal)]
    outage = {}

    def kill_and_restart() -> None:  # SIGKILL once step 2's samples were scored, back 2 s later
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if journal.exists() and ":s2-" in journal.read_text():
                os.kill(server[0].pid, signal.SIGKILL)
                server[0].wait()
                outage["killed"] = time.monotonic()
                time.sleep(2.0)
                server[0] = _start_server(port, journal)
                return
            time.sleep(0.02)

    url = f"http://127.0.0.1:{port}/score"
    cfg = _config(tmp_path, nano_dir, {"http": url, "name": "svc", "batch_size": 3,
                                       "backoff_s": 0.1, "max_backoff_s": 0.5, "retries": 30})
    watcher = threading.Thread(target=kill_and_restart)
    watcher.start()
    try:
        Trainer(cfg).run()
    finally:
        watcher.join()
        server[0].kill()
    assert "killed" in outage
    rows = [r for r in _rows(tmp_path / "run") if r["step"] > 0]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["reward/errors"] == 0 and r["reward/svc/errors"] == 0 for r in rows)
    assert sum(r["reward/svc/down_s"] for r in rows) > 0.5  # the outage, seen by the run
    assert sum(r["reward/svc/retries"] for r in rows) >= 1
    # server side: every training sample of every step scored exactly once, across both
    # server processes (the journal is their shared record)
    keys = [json.loads(x)["key"] for x in journal.read_text().splitlines()]
    assert len(keys) == len(set(keys))
    ids = sorted(k.split(":")[-2] for k in keys if ":s" in k)
    want = sorted(f"s{s}-{i}" for s in range(1, STEPS + 1) for i in range(PROMPTS * GROUP))
    assert ids == want


def test_dead_reward_url_is_one_line_before_any_work(tmp_path, nano_dir):
    url = f"http://127.0.0.1:{_free_port()}/score"
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), "reward": {"http": url},
                                        "policy": {"model": {"path": str(nano_dir)}}}))
    proc = subprocess.run([sys.executable, "-m", "agentrt.cli", "train", str(cfg_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert lines == [f"error: reward.0.http: cannot reach {url} (connection refused); start "
                     "the reward service or fix the URL"]
    assert not (tmp_path / "run").exists()


def test_reward_service_that_dies_for_good_stops_the_run_at_its_last_checkpoint(tmp_path,
                                                                                nano_dir):
    port, journal = _free_port(), tmp_path / "scores.jsonl"
    server = _start_server(port, journal)

    metrics = tmp_path / "run" / "metrics.jsonl"

    def step_1_done() -> bool:  # the run trained step 1: its metrics row is written
        if not metrics.exists():
            return False
        lines = metrics.read_text().split("\n")[:-1]  # complete lines only
        return any(json.loads(x)["step"] >= 1 for x in lines)

    def kill() -> None:  # SIGKILL for good once step 1 was trained on the service's scores
        # (not on the journal: the journal is fsynced before the answer leaves, so a kill
        # timed on it can drop step 1's answer)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not step_1_done():
            time.sleep(0.02)
        server.kill()
        server.wait()

    cfg = _config(tmp_path, nano_dir, {"http": f"http://127.0.0.1:{port}/score",
                                       "retries": 2, "backoff_s": 0.05}, steps=6)
    watcher = threading.Thread(target=kill)
    watcher.start()
    try:
        with pytest.raises(RunStopped) as stopped:
            Trainer(cfg).run()
    finally:
        watcher.join()
    message = str(stopped.value)
    step = int(message.split(":")[0].removeprefix("step "))
    assert step >= 2 and message.startswith(
        f"step {step}: the reward failed on 100% of the samples (reward service http did not "
        "answer within its retries (reward/http/down_s="), message
    assert f"the checkpoint of step {step - 1} is kept" in message
    # every sample the run trained on was scored by the service; the failed step trained
    # nothing (the service may have journaled part of it before the kill dropped its answer)
    scored = {json.loads(x)["key"].split(":")[-2] for x in journal.read_text().splitlines()}
    trained = {f"s{s}-{i}" for s in range(1, step) for i in range(PROMPTS * GROUP)}
    assert trained <= scored
    assert not any(k.startswith(f"s{s}-") for k in scored for s in range(step + 1, 8))
    assert max(r["step"] for r in _rows(tmp_path / "run")) == step - 1


# ----------------------------------------------------------------------------- reward model
def test_reward_model_learns_to_prefer_right_answers_and_drives_grpo(tmp_path, nano_dir,
                                                                     monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import train_reward_model as rm

    rng = random.Random(0)
    for answer in ("0", "7", "10", "99", "118", "-5"):
        for kind in rm.NEGATIVES:  # every hard negative is wrong by exact match
            assert rm.negative(kind, answer, rng).strip() != answer, (kind, answer)
    assert {rm.negative("tens_digit", "118", rng)[::2] for _ in range(20)} == {"18"}
    assert rm.parse_weights(["off_by_10=6", "tens_digit=0.5"]) == {"off_by_10": 6.0,
                                                                   "tens_digit": 0.5}
    with pytest.raises(ValueError, match="unknown kind 'off_by_11'; valid: off_by_1, "):
        rm.parse_weights(["off_by_11=2"])
    # the per-token loss reads each reply character where the classifier's input has it
    tokenizer = AutoTokenizer.from_pretrained(nano_dir)
    ids = encode(tokenizer, ["26+53=", "1+2="], ["78", "7x"], 16)["input_ids"]
    rows, cols, labels = rm.prefix_labels(tokenizer, ["78", "7x"], ["79", "3"], ids.shape[1])
    assert [tokenizer.decode(ids[r, c]) for r, c in zip(rows, cols)] == ["7", "8", "7", "x"]
    assert labels == [1.0, 0.0, 0.0, 0.0]
    task_train, task_eval = make_splits("arithmetic", {"digits": 1}, 200, 20, 1234)
    train, heldout = rm.split_prompts(task_train, 20, seed=1)
    prompts = {ex.prompt for ex in train}
    assert len(heldout) == 20 and not prompts & {ex.prompt for ex in heldout}
    assert not (prompts | {ex.prompt for ex in heldout}) & {ex.prompt for ex in task_eval}
    folder = tmp_path / "rm"
    # 1-digit sums; on-policy negatives sampled from nano_dir (seeded, deterministic)
    result = rm.train(folder, preset="llama-nano", steps=100, batch_size=32, lr=3e-3, seed=0,
                      digits=1, train_size=200, eval_size=20, heldout=20, lm_steps=0,
                      policy=str(nano_dir), policy_samples_per_prompt=2, extra_layers=1,
                      negative_weights={"tens_digit": 2.0}, position_loss=0.5, log_every=0)
    by_kind = result["heldout_by_kind"]
    assert set(by_kind) == {*rm.NEGATIVES, "policy", "all"}, by_kind
    assert result["heldout_policy_pairs"] > 0 and by_kind["policy"] >= 0.9, result
    assert result["heldout_accuracy"] >= 0.7, result
    executor = build_executor(parse_reward({"model": str(folder)}))
    values, errors, metrics = executor.score_batch([
        Sample("a", "3+4=", "7", {}), Sample("b", "3+4=", "x+", {})])
    # pointwise (bce) models are saved with 2 labels: the reward is P(right)
    assert errors == [None, None] and 1 > values[0] > 0.5 > values[1] > 0, values
    assert metrics["reward/model/latency_s"] > 0
    cfg = _config(tmp_path, nano_dir, {"model": str(folder), "name": "rm"}, steps=2)
    last = Trainer(cfg).run()
    assert last["reward/rm/errors"] == 0 and "actor/loss" in last
    assert last["reward/std"] > 0  # the learned reward tells the group's samples apart


def test_bad_reward_sources_are_one_line_naming_the_field(tmp_path, nano_dir):
    with pytest.raises(ConfigError, match=r"^invalid config: reward\.0: unknown reward source "
                                          r"kind \(keys: grpc\); give exactly one of"):
        validate_config({"reward": [{"grpc": "x"}]}, TrainConfig)
    with pytest.raises(ConfigError, match=r"reward\.1\.timeout_s: Input should be greater"):
        validate_config({"reward": ["exact_match", {"http": "http://h/x", "timeout_s": 0}]},
                        TrainConfig)
    with pytest.raises(ConfigError, match=r"^reward\.0\.model: '.*' is LlamaForCausalLM, not a "
                                          r"sequence classifier"):
        check_reward(parse_reward({"model": str(nano_dir)}))
    with pytest.raises(ConfigError, match=r"^reward\.0\.python: unknown reward 'nope'"):
        check_reward(parse_reward([{"python": "nope"}]))


def test_reward_url_credentials_stay_out_of_files_and_messages(tmp_path):
    """Issue 41 (10): a reward URL's password and API key are *** in the saved config (so in
    versions.json, which reads it) and in the unreachable-URL line; the request keeps them."""
    from agentrt.config.load import dump_config
    from agentrt.core.errors import ConfigError
    from agentrt.rewards.sources import HttpSource

    url = f"http://bob:hunter2@127.0.0.1:{_free_port()}/score?api_key=k-123&mode=fast"
    src = HttpSource(http=url)
    assert src.http == url  # what the executor sends
    saved = dump_config(src)
    assert "hunter2" not in saved and "k-123" not in saved
    assert "bob:***@" in saved and "api_key=***&mode=fast" in saved
    with pytest.raises(ConfigError) as err:
        src.check("reward.0")
    assert "hunter2" not in str(err.value) and "k-123" not in str(err.value)
