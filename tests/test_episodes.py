"""The episode log (agentrt.controller.episodes): every trained episode of ``agentrt train`` has a row under
a stable id; a run killed after a step past its checkpoint and resumed ends with exactly the rows
of an uninterrupted run (same ids, prompts, responses, rewards, log-probs), none twice, and a
SIGKILL'd ``agentrt train`` process leaves whole steps only, from which a resume ends with the
uninterrupted run's rows. Real runs of llama-nano, in-process (the CLI adds nothing here) except
the killed one, which needs a process to kill."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrt.config.load import validate_config
from agentrt.controller.episodes import EPISODES, Episode, EpisodeLog, _dict_json, episode_id
from agentrt.workloads.prompts.workload import Trainer
from agentrt.workloads.prompts.config import TrainConfig

PROMPTS, GROUP = 2, 2


@pytest.fixture(scope="module")
def nano_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrt.policies.models import build_model

    return build_model(tmp_path_factory.mktemp("models") / "nano", "llama-nano", seed=0)


def config(run_dir: Path, model_dir: Path, steps: int) -> dict[str, Any]:
    return {"seed": 0, "run_dir": str(run_dir), "progress": False, "threads": 1,
            "task": {"name": "arithmetic", "train_size": 32, "eval_size": 4},
            "policy": {"id": "arith", "model": {"path": str(model_dir)},
                       "rollout": {"sampling": {"max_new_tokens": 3, "temperature": 0.9}}},
            "train": {"steps": steps, "prompts_per_step": PROMPTS, "group_size": GROUP},
            "eval": {"every": 100}, "checkpoint": {"every": 2, "keep": 5}}


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [vars(e) for e in EpisodeLog(run_dir)]


def test_rows_hold_each_trained_episode(tmp_path: Path, nano_dir: Path) -> None:
    Trainer(validate_config(config(tmp_path / "run", nano_dir, 2), TrainConfig)).run()
    log = EpisodeLog(tmp_path / "run")
    got = list(log)
    assert [e.id for e in got] == [episode_id(s, i) for s in (1, 2)
                                   for i in range(PROMPTS * GROUP)]
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text()
               .splitlines()]
    for step in (1, 2):  # the rows are the episodes the step's reward metrics came from
        mean = sum(e.reward for e in got if e.step == step) / (PROMPTS * GROUP)
        assert mean == pytest.approx(next(m for m in metrics if m["step"] == step)["reward/mean"])
    e = log.get("s2-3")
    assert e is not None and e.step == 2 and e.idx == 3 and e.policy_id == "arith"
    assert e.policy_version == 1  # step 2 samples with the weights of one update
    assert len(e.response_ids) == len(e.logprobs) >= 1 and all(lp <= 0 for lp in e.logprobs)
    assert e.prompt.endswith("=") and e.info["answer"] == str(eval(e.prompt[:-1]))
    assert e.sampling["temperature"] == 0.9 and e.sampling["max_new_tokens"] == 3
    assert log.get("s9-0") is None and [x.id for x in log.rows(step=1)][:1] == ["s1-0"]


def test_resume_replaces_rows_after_the_checkpoint(tmp_path: Path, nano_dir: Path) -> None:
    Trainer(validate_config(config(tmp_path / "straight", nano_dir, 4), TrainConfig)).run()
    cfg = validate_config(config(tmp_path / "killed", nano_dir, 4), TrainConfig)
    Trainer(cfg).run(stop_after=3)  # checkpoint at step 2; step 3's rows are written
    killed = rows(tmp_path / "killed")
    assert max(r["step"] for r in killed) == 3
    # a row a killed run wrote past its checkpoint, of a step the resumed run never replays
    stale = Episode(**{**killed[-1], "id": "s7-0", "step": 7})
    conn = sqlite3.connect(tmp_path / "killed" / EPISODES)
    with conn:
        conn.execute(f"INSERT INTO episodes ({', '.join(stale.row())}) VALUES "
                     f"({', '.join('?' * len(stale.row()))})", list(stale.row().values()))
    conn.close()
    Trainer(cfg).run()  # resumes from step 2, replays 3 and 4
    assert rows(tmp_path / "killed") == rows(tmp_path / "straight")


def test_sigkill_leaves_whole_steps_and_resume_completes(tmp_path: Path,
                                                         nano_dir: Path) -> None:
    steps = 6
    cfg = config(tmp_path / "run", nano_dir, steps)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "agentrt.cli", "train",
                                 str(tmp_path / "c.yaml")], stdout=subprocess.DEVNULL, stderr=sink)
    path = tmp_path / "run" / EPISODES
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:  # kill after a few steps
        if path.is_file() and len({r["step"] for r in rows(tmp_path / "run")}) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, err.read_text()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = rows(tmp_path / "run")
    counts = {s: sum(r["step"] == s for r in left) for s in {r["step"] for r in left}}
    assert set(counts.values()) == {PROMPTS * GROUP} and sorted(counts) == list(
        range(1, max(counts) + 1))
    Trainer(validate_config(cfg, TrainConfig)).run()  # the resume (in this process: no second start-up)
    Trainer(validate_config(config(tmp_path / "straight", nano_dir, steps), TrainConfig)).run()
    assert rows(tmp_path / "run") == rows(tmp_path / "straight")


def test_rows_written_with_shared_json_read_back_as_written(tmp_path: Path) -> None:
    """A step's rows share the JSON text of equal prompts while it is written; each row still
    reads back as its own episode, its lists and dicts as ``json.dumps`` writes them (ids that
    are not all ints, a list in the sampling settings), its log-probs as float64 bytes (a
    non-finite one too), or JSON where they are not numbers; a row of an older log, log-probs
    as JSON text, reads back as well."""
    def episode(i: int, prompt: list) -> Episode:
        return Episode(id=episode_id(3, i), step=3, idx=i, policy_id="p", policy_version=1,
                       prompt="q", response="a", prompt_ids=prompt, response_ids=[i, 7],
                       logprobs=[-0.5 * i, float("-inf")], reward=float(i),
                       info={"answer": str(i)}, sampling={"temperature": 1.0, "stop": [5, i]},
                       group_id=str(i // 2))

    episodes = [episode(0, [1, 2]), episode(1, [1, 2]), episode(2, [1, 3]),
                episode(3, [1.0, 3.0]), episode(4, [1, float("inf")])]
    # dicts written once per object and per content of strings, never equal-but-other values
    shared = {"temperature": 0.7, "stop": [5]}
    for i, info in enumerate([{"answer": "1"}, {"answer": "1"}, {"ok": True}, {"ok": 1},
                              {"ok": 1.0}]):
        episodes.append(Episode(id=episode_id(3, 5 + i), step=3, idx=5 + i, policy_id="p",
                                policy_version=1, prompt="q", response="a", prompt_ids=[True],
                                response_ids=[1], logprobs=[-1.0], reward=0.0, info=info,
                                sampling=shared))
    episodes[-1].logprobs = [None]  # not numbers: written as JSON
    log = EpisodeLog(tmp_path)
    log.append_step(3, episodes)
    assert list(log) == episodes
    columns = ("prompt_ids", "response_ids", "info", "sampling")
    with sqlite3.connect(tmp_path / EPISODES) as conn:
        texts = conn.execute(f"SELECT {', '.join(columns)} FROM episodes ORDER BY idx").fetchall()
        blobs = [b for (b,) in conn.execute("SELECT logprobs FROM episodes ORDER BY idx")]
        old = conn.execute("SELECT * FROM episodes WHERE idx = 0").fetchone()
        conn.execute("INSERT INTO episodes VALUES (?, 4, 0, ?, ?, ?, ?, ?, ?, '[-0.25, -1.5]', "
                     "?, ?, ?, ?, ?)", ("s4-0", *old[3:9], *old[10:]))
    assert texts == [tuple(json.dumps(getattr(e, c)) for c in columns) for e in episodes]
    assert blobs == [struct.pack(f"<{len(e.logprobs)}d", *e.logprobs)
                     for e in episodes[:-1]] + ["[null]"]
    assert log.get("s4-0").logprobs == [-0.25, -1.5]
    memo: dict = {}  # keys too: True and 1 are equal keys of other JSON (read back as strings)
    assert [_dict_json(d, memo) for d in ({True: "a"}, {1: "a"})] == ['{"true": "a"}',
                                                                       '{"1": "a"}']
