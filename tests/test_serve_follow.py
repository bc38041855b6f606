"""`agentrt serve RUN_DIR --follow`: a real server follows a real GRPO run while it trains,
takes each newer checkpoint through the canary path under load, and a killed server comes back
serving the same version with its running canary where it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from agentrt.core.errors import AgentrtError
from agentrt.serving.follow import Follower
from tests.test_serve import Server

TOKEN = "follow-token"
STEPS, EVERY = 12, 4  # the run: 3 checkpoints after step 0
SCORER = "def score(prompt, response, info):\n    return 1.0\n"


def train_config(run_dir: Path, model_dir: Path, steps: int, paused: bool = False) -> dict:
    return {
        "seed": 0, "run_dir": str(run_dir), "progress": False,
        "task": {"name": "arithmetic", "train_size": 200, "eval_size": 8},
        "policy": {"id": "arith", "model": {"path": str(model_dir)}, "optim": {"lr": 1e-3},
                   "micro_batch_size": 8, "algorithm": {"name": "grpo"},
                   "rollout": {"sampling": {"max_new_tokens": 4}}},
        "train": {"steps": steps, "prompts_per_step": 8, "group_size": 4},
        "eval": {"every": steps}, "checkpoint": {"every": EVERY, "keep": 2, "models": True},
        # held after its step-0 checkpoint until `agentrt ctl RUN resume`, then a step a
        # second at most: checkpoints keep coming while the server is under load
        "control": {"enabled": True, "http": {"enabled": True, "port": 0},
                    "start_paused": paused, "step_interval_s": 1.0 if paused else 0.0},
    }


def steps_of(run_dir: Path) -> set[int]:
    return {int(p.name.removeprefix("step_")) for p in (run_dir / "checkpoints").glob("step_*")
            if (p / "manifest.json").is_file()}


def follow(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "agentrt.cli", "serve", str(run_dir), "--follow",
            "--port", "0", "--token", TOKEN, "--max-tokens", "4", "--max-batch", "32",
            "--canary-log", str(run_dir.parent / "canary.jsonl"), *extra]


def admin(url: str, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, url + path, headers={"Authorization": f"Bearer {TOKEN}"},
                         timeout=120, **kw)


def wave(url: str, n: int = 200) -> tuple[list[str], list[str]]:
    """``n`` requests at once; (fingerprints of the answers, failures)."""
    def one(i: int) -> str:
        res = httpx.post(f"{url}/v1/completions", timeout=300,
                         headers={"Authorization": f"Bearer {TOKEN}"},
                         json={"model": "arith", "prompt": f"{i % 10}+{i % 7}=",
                               "max_tokens": 4})
        res.raise_for_status()
        return res.json()["system_fingerprint"]

    answers, failures = [], []
    with ThreadPoolExecutor(n) as pool:
        for f in [pool.submit(one, i) for i in range(n)]:
            try:
                answers.append(f.result())
            except Exception as exc:  # noqa: BLE001 - counted, asserted to be none
                failures.append(repr(exc))
    return answers, failures


@pytest.fixture
def env(tmp_path, monkeypatch):
    (tmp_path / "follow_scorer.py").write_text(SCORER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two processes on 2 cores


def test_follow_serves_200_concurrent_requests_while_the_run_writes_checkpoints(
        tmp_path, tiny_model_dir, env):
    run_dir = tmp_path / "run"
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(train_config(run_dir, tiny_model_dir,
                                                                     STEPS, paused=True)))
    trainer = subprocess.Popen([sys.executable, "-m", "agentrt.cli", "train",
                                str(tmp_path / "train.yaml")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # started before the run's first checkpoint: it waits for one
        with Server(follow(run_dir, "--canary-share", "0.5", "--canary-margin", "0.5",
                           "--canary-scorer", "follow_scorer:score")) as url:
            newest_at_start = max(steps_of(run_dir))
            assert newest_at_start == 0  # the run holds until it is resumed
            deadline = time.monotonic() + 120
            while not (run_dir / "control.json").is_file():  # its loop is up
                assert time.monotonic() < deadline and trainer.poll() is None, "no control.json"
                time.sleep(0.2)
            resumed = subprocess.run([sys.executable, "-m", "agentrt.cli", "ctl", str(run_dir),
                                      "resume"], capture_output=True, text=True, timeout=60)
            assert resumed.returncode == 0, resumed.stdout + resumed.stderr
            waves, answers, failures = 0, [], []
            while trainer.poll() is None or waves < 2:
                got, failed = wave(url)
                waves, answers, failures = waves + 1, answers + got, failures + failed
            written = set(range(newest_at_start + EVERY, STEPS + 1, EVERY))
            time.sleep(3)  # the last checkpoint's canary: one more poll
            got, failed = wave(url)
            answers, failures = answers + got, failures + failed
            canaries = admin(url, "GET", "/admin/canary").json()["canaries"]
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert trainer.wait() == 0, trainer.stderr.read()[-2000:]
    assert failures == [] and len(answers) == 200 * (waves + 1)
    assert len(written) >= 3, (newest_at_start, written)  # checkpoints written while it served
    promoted = [c for c in canaries if c["state"] == "promoted"]
    assert len(promoted) >= 2, canaries  # swapped in through the canary path
    assert len(set(answers)) >= 2  # answers came from more than one version
    state = json.loads((run_dir / "serve_follow" / "follow.json").read_text())
    assert state["current"]["arith"]["step"] == max(s for s in state["tried"].values())
    print(f"{waves + 1} waves of 200 concurrent requests, 0 failures; checkpoints written "
          f"meanwhile: {sorted(written)}; canaries promoted: {len(promoted)}; versions that "
          f"answered: {len(set(answers))}")


def test_a_killed_follow_server_comes_back_with_its_version_and_its_running_canary(
        tmp_path, tiny_model_dir, env):
    run_dir = tmp_path / "run"
    cfg = train_config(run_dir, tiny_model_dir, steps=EVERY)
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    subprocess.run([sys.executable, "-m", "agentrt.cli", "train", str(tmp_path / "train.yaml")],
                   check=True, capture_output=True)
    newest = run_dir / "checkpoints" / f"step_{EVERY}"
    hidden = tmp_path / "newest"
    shutil.move(newest, hidden)  # the run "writes" it once the server serves step 0
    cmd = follow(run_dir, "--canary-share", "0.5", "--canary-margin", "0.05")  # no scorer
    server = Server(cmd)
    url = server.__enter__()
    try:
        assert admin(url, "GET", "/admin/versions").json()["versions"][0]["path"].endswith(
            "step_0")
        shutil.move(hidden, newest)
        deadline = time.monotonic() + 60
        while not (runs := admin(url, "GET", "/admin/canary").json()["canaries"]):
            assert time.monotonic() < deadline, "no canary of the newest step"
            time.sleep(0.5)
        assert runs[0]["state"] == "running" and runs[0]["path"].endswith(newest.name)
        ids = []
        for i in range(30):
            res = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {TOKEN}"},
                             json={"model": "arith", "prompt": f"{i}+1=", "max_tokens": 2},
                             timeout=120).json()
            ids.append(res["id"])
        for rid in ids[:20]:  # rewards for 20; 10 still wait for theirs
            assert admin(url, "POST", "/v1/feedback", json={"id": rid, "reward": 1}).json()[
                "counted"]
        before = admin(url, "GET", "/admin/canary").json()["canaries"][0]
        time.sleep(2.5)  # a poll saves the state
    finally:
        server.proc.kill()  # no clean shutdown
        server.proc.wait()
    with Server(cmd) as url:
        versions = admin(url, "GET", "/admin/versions").json()["versions"]
        current = [v for v in versions if v["current"]]
        assert current[0]["path"].endswith("step_0")  # still the version it served
        deadline = time.monotonic() + 60
        while not (runs := admin(url, "GET", "/admin/canary").json()["canaries"]):
            assert time.monotonic() < deadline, "the canary did not come back"
            time.sleep(0.5)
        after = runs[0]
        assert after["state"] == "running" and after["path"].endswith(newest.name)
        assert after["samples"] == before["samples"] and after["routed"] == before["routed"]
        assert sum(before["samples"].values()) == 20
        assert after["events"][0]["event"] == "resume"
        # a response served before the restart still gets its reward counted
        out = admin(url, "POST", "/v1/feedback", json={"id": ids[25], "reward": 1}).json()
        assert out["counted"], out
        samples = admin(url, "GET", "/admin/canary").json()["canaries"][0]["samples"]
        assert sum(samples.values()) == 21


def test_follow_refuses_a_run_that_writes_no_models(tmp_path, tiny_model_dir):
    cfg = train_config(tmp_path, tiny_model_dir, steps=1)
    cfg["checkpoint"]["models"] = False
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(AgentrtError, match="checkpoint.models: true"):
        Follower(tmp_path, {}).sources(wait_s=0)
