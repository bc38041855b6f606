"""A league with a Redis memory bank, run once straight through and once killed with SIGKILL at
random moments and resumed with the same command: what each leaves behind, compared.

Shared by tests/tournaments/test_league_replay_redis.py (a few kills) and bench/league_replay.py
(20 kills). Everything is real: ``agentrt tournament run`` subprocesses, a real redis-server,
SIGKILL to the run's whole process group. The kill moments come from a seeded RNG; what is
compared is only the final state, never timing.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis
import yaml

PREFIX = "replay"  # Redis key prefix of the bank (the same in both runs: it is part of the
# config)


def league_config(run_dir: Path, redis_url: str, steps: int = 8) -> dict[str, Any]:
    """A short Recall-v0 league of a llama-nano learner that reads and writes a Redis bank."""
    return {
        "seed": 0, "run_dir": str(run_dir), "progress": False, "threads": 1,
        "memory": {"banks": {"recall": {"backend": "redis", "embedder": "hashing",
                                        "redis": {"url": redis_url, "key_prefix": PREFIX}}}},
        "envs": [{"id": "Recall-v0",
                  "template": {"first": "{observation}\nAnswer: ", "history": False}}],
        "policies": [{"id": "lm", "model": {"preset": "llama-nano"},
                      "rollout": {"sampling": {"temperature": 1.0, "max_new_tokens": 5}},
                      "memory": {"bank": "recall", "backend": "redis", "k": 1,
                                 "token_budget": 32, "write": ["facts", "outcome"]}}],
        "schedule": {"format": "pfsp"},
        "train": {"steps": steps, "games_per_step": 4},
        "eval": {"every": 100, "games": 2, "opponents": []},
        # Every 2 steps: a kill between two checkpoints leaves a step to replay.
        "checkpoint": {"every": 2, "keep": 2},
    }


def write_config(folder: Path, redis_url: str, steps: int = 8) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "league.yaml"
    path.write_text(yaml.safe_dump(league_config(folder / "run", redis_url, steps)))
    return path


def launch(cfg: Path, log: Path) -> subprocess.Popen:
    """``agentrt tournament run cfg`` in its own session (one killpg reaches all of it)."""
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "agentrt.cli", "tournament", "run", str(cfg)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})


def run_through(cfg: Path, log: Path, timeout_s: float = 600) -> float:
    """Runs the league to its end; returns how long that took (seconds, to pick kill moments)."""
    start = time.monotonic()
    proc = launch(cfg, log)
    code = proc.wait(timeout_s)
    if code != 0:
        raise RuntimeError(f"league exited {code}; log:\n{log.read_text()[-3000:]}")
    return time.monotonic() - start


def run_killed(cfg: Path, log: Path, kills: int, span_s: float, seed: int = 0,
               timeout_s: float = 600) -> int:
    """Starts the league ``kills`` times, each killed with SIGKILL after a random share (5-70%)
    of ``span_s``, then once more to its end. A start that ends before its kill ends the kills
    (the run is complete). Returns the kills done."""
    rng = random.Random(seed)
    done = 0
    for _ in range(kills):
        proc = launch(cfg, log)
        try:
            code = proc.wait(rng.uniform(0.05, 0.7) * span_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            done += 1
            with open(log, "a") as out:
                out.write("\n==== SIGKILL ====\n")
            continue
        if code != 0:
            raise RuntimeError(f"league exited {code}; log:\n{log.read_text()[-3000:]}")
        break  # it finished before its kill
    proc = launch(cfg, log)
    code = proc.wait(timeout_s)
    if code != 0:
        raise RuntimeError(f"resumed league exited {code}; log:\n{log.read_text()[-3000:]}")
    return done


# ---------------------------------------------------------------------- what a run leaves
def metric_rows(run_dir: Path) -> list[tuple]:
    """(step, match/games) of every metrics row, in file order (timings differ between runs)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    return [(r["step"], r.get("match/games")) for r in rows]


def match_rows(run_dir: Path) -> list[tuple]:
    """Every match record with its seats (the wall-clock stamp left out)."""
    with sqlite3.connect(run_dir / "matches.sqlite") as conn:
        matches = conn.execute("SELECT match_id, env, step, round, length, info FROM matches "
                               "ORDER BY match_id").fetchall()
        seats = conn.execute("SELECT * FROM seats ORDER BY match_id, seat").fetchall()
    return [*map(tuple, matches), *map(tuple, seats)]


def memory_rows(redis_url: str, run_dir: Path | None = None) -> list[tuple]:
    """Every record of the bank in Redis (only those ``run_dir``'s run wrote, when given): text
    and metadata (the wall-clock time left out), and the vector's bytes. The record id and the
    ``run:`` tag derive from the run folder's ``run_uid``, so they are checked here (each record
    of the run carries it) and left out of what two runs' records are compared by."""
    uid = json.loads((run_dir / "run.json").read_text()).get("run_uid") if run_dir else None
    client = redis.Redis.from_url(redis_url)
    out = []
    for rid, data in client.hgetall(f"{PREFIX}:recall:records").items():
        head, _, vec = data.partition(b"\0")
        rec = json.loads(head)
        rec.pop("time")
        runs = [t for t in rec["tags"] if t.startswith("run:")]
        assert len(runs) == 1 and rec["id"] == rid.decode(), rec
        if uid is not None and runs != [f"run:{uid}"]:
            continue
        rec["tags"] = [t for t in rec["tags"] if not t.startswith("run:")]
        rec.pop("id")
        out.append((json.dumps(rec, sort_keys=True), vec))
    client.close()
    return sorted(out)


def state(run_dir: Path, redis_url: str) -> dict[str, list[tuple]]:
    return {"metrics rows": metric_rows(run_dir), "match records": match_rows(run_dir),
            "memory records": memory_rows(redis_url, run_dir)}


def compare(straight: dict[str, list[tuple]], killed: dict[str, list[tuple]]
            ) -> dict[str, dict[str, int]]:
    """Per kind: rows of each run, rows missing from the killed run, rows it holds twice or
    more (extra copies) and rows it holds that the straight run does not."""
    out = {}
    for kind, want in straight.items():
        got = Counter(killed[kind])
        ref = Counter(want)
        out[kind] = {"uninterrupted": len(want), "killed": len(killed[kind]),
                     "missing": sum((ref - got).values()),
                     "duplicated": sum(n - 1 for n in got.values() if n > 1),
                     "foreign": sum((got - ref).values())}
    return out


def flush(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    client.close()
