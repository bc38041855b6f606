"""Issue 41, must-show 4: kill -9 at random moments of every run command, with a Redis prompt
stream, and with the newest checkpoint damaged before some resumes.

    .venv/bin/python bench/kill_resume.py                      # 20 kills per command, seed 0
    .venv/bin/python bench/kill_resume.py --kills 5 --only train stream

For each command (``agentrt train``, ``train`` on a Redis prompt stream, ``tournament run``,
``decompose run``, and ``train`` whose newest checkpoint is zero-filled after every other kill)
it runs a small run of llama-nano once straight through, then again in a new folder, SIGKILLing
the whole process group after a random share (seeded) of the straight run's duration, ``--kills``
times, resuming with the same command after each, and finally letting it end. A resume may also
refuse with one ``error:`` line (exit 2): that counts as a refusal and the run is resumed again
after it (nothing else changes between the two); a last run that refuses in one line naming what
was lost (a stream whose final checkpoint was damaged after its prompts were acknowledged) is an
allowed end, reported as such. It compares what each run left: metrics steps,
episode log ids, match ids, chain steps, and for the stream every pushed prompt's count in the
episodes stream (each exactly once: its group of 2 samples). Exits 1 unless every killed run holds exactly the straight
run's records or ends in such a refusal, and every refusal is one line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any, Callable

import yaml

from agentrt.testing.redis_server import RedisServer

NANO = {"preset": "llama-nano"}
BASE = {"seed": 0, "progress": False, "threads": 1, "checkpoint": {"every": 1, "keep": 3}}
PROMPTS = 4 * 6 * 8  # the stream: prompts per step x steps x 8
GROUP = 2  # samples per prompt: each prompt's episodes reach the episodes stream GROUP times


def train_cfg(run: Path, redis_url: str | None, steps: int = 6) -> dict[str, Any]:
    task: dict[str, Any] = {"name": "arithmetic", "train_size": 64, "eval_size": 4}
    if redis_url is not None:
        key = f"{run.parent.parent.name}-{run.parent.name}"  # command-arm
        task = {"name": "redis", "options": {
            "redis": {"url": redis_url}, "stream": f"p-{key}",
            "episodes_stream": f"e-{key}", "wait_s": 60,
            "columns": {"prompt": "prompt", "answer": "answer"}}}
    return {**BASE, "run_dir": str(run), "task": task, "reward": "exact_match",
            "policy": {"model": NANO, "rollout": {"sampling": {"max_new_tokens": 3}}},
            "train": {"steps": steps, "prompts_per_step": 4, "group_size": GROUP},
            "eval": {"every": 3}}


def league_cfg(run: Path, _: str | None) -> dict[str, Any]:
    return {**BASE, "run_dir": str(run), "envs": [{"id": "TicTacToe-v0"}],
            "baselines": [{"id": "random"}],
            "policies": [{"id": "lm", "model": NANO,
                          "rollout": {"sampling": {"max_new_tokens": 3}}}],
            "warm_start": {"steps": 2, "games_per_step": 4},
            "train": {"steps": 6, "games_per_step": 4}, "eval": {"every": 3, "games": 2}}


def decompose_cfg(run: Path, _: str | None) -> dict[str, Any]:
    return {**BASE, "run_dir": str(run),
            "family": {"name": "wordchain", "train_size": 64, "eval_size": 4, "seed": 5},
            "planner": {"kind": "rule"},
            "policies": [{"id": "reader", "model": NANO, "skills": ["parse", "format"],
                          "rollout": {"sampling": {"max_new_tokens": 8}}},
                         {"id": "calc", "model": NANO, "skills": ["add", "sub", "mul", "div"],
                          "rollout": {"sampling": {"max_new_tokens": 8}}}],
            "train": {"steps": 6, "tasks_per_step": 4, "group_size": 2},
            "eval": {"every": 3, "size": 4}}


# name -> (command, config, uses the stream, damages the newest checkpoint)
COMMANDS: dict[str, tuple[list[str], Callable[..., dict], bool, bool]] = {
    "train": (["train"], train_cfg, False, False),
    "stream": (["train"], train_cfg, True, False),
    "tournament": (["tournament", "run"], league_cfg, False, False),
    "decompose": (["decompose", "run"], decompose_cfg, False, False),
    # 24 steps: kills land between checkpoints often enough for 20 of them, half followed by
    # a damaged newest checkpoint
    "damaged": (["train"], lambda run, url: train_cfg(run, url, steps=24), False, True),
    "stream-damaged": (["train"], train_cfg, True, True),
}


def launch(command: list[str], cfg: Path, log: Path) -> subprocess.Popen:
    with open(log, "a") as out:
        return subprocess.Popen([sys.executable, "-m", "agentrt.cli", *command, str(cfg)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE,
                                text=True, start_new_session=True,
                                env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})


def finish(proc: subprocess.Popen, timeout: float = 900) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def records(run: Path, redis_url: str | None, stream: str | None) -> dict[str, Any]:
    """What a run left, without timings."""
    out: dict[str, Any] = {"metrics steps": [json.loads(x)["step"] for x in
                                             (run / "metrics.jsonl").read_text().splitlines()]}
    with closing(sqlite3.connect(run / "episodes.sqlite")) as db:
        out["episode ids"] = sorted(r[0] for r in db.execute("SELECT id FROM episodes"))
    if (run / "matches.sqlite").is_file():
        with closing(sqlite3.connect(run / "matches.sqlite")) as db:
            out["match ids"] = sorted(r[0] for r in db.execute("SELECT match_id FROM matches"))
    if (run / "chains.jsonl").is_file():
        out["chain steps"] = sorted(Counter(json.loads(x)["step"] for x in
                                            (run / "chains.jsonl").read_text().splitlines())
                                    .items())
    if stream is not None:
        import redis

        client = redis.Redis.from_url(redis_url)
        sent = Counter(json.loads(f[b"json"])["prompt_id"] for _, f in client.xrange(stream))
        out["stream prompts trained"] = sorted(Counter(sent.values()).items())
        client.close()
    return out


def damage_newest(run: Path) -> bool:
    """Zero-fills the newest checkpoint's state.pt where an older good one remains."""
    ckpts = sorted((run / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
    if len(ckpts) < 2:
        return False
    state = ckpts[-1] / "state.pt"
    state.write_bytes(bytes(state.stat().st_size))
    return True


def probe(name: str, kills: int, seed: int, root: Path, redis_url: str,
          latest: float = 0.9) -> dict[str, Any]:
    command, make, streamed, damaging = COMMANDS[name]
    url = redis_url if streamed else None
    result: dict[str, Any] = {}
    for arm in ("straight", "killed"):
        folder = root / name / arm
        folder.mkdir(parents=True)
        cfg_data = make(folder / "run", url)
        if streamed:
            import redis

            client = redis.Redis.from_url(redis_url)
            pipe = client.pipeline()
            for i in range(PROMPTS):
                pipe.xadd(f"p-{name}-{arm}", {"prompt": f"{i}+1=", "answer": str(i + 1)})
            pipe.execute()
            client.close()
            cfg_data["train"]["steps"] = PROMPTS // 4
        cfg = folder / "run.yaml"
        cfg.write_text(yaml.safe_dump(cfg_data))
        log = folder / "log.txt"
        rng = random.Random(seed)
        started, killed, refused, damaged, bad_refusals = time.monotonic(), 0, 0, 0, []
        if arm == "killed":
            while killed < kills:
                proc = launch(command, cfg, log)
                try:
                    code, err = finish(proc, rng.uniform(0.05, latest) * result["span_s"])
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.communicate()
                    killed += 1
                    if damaging and killed % 2 == 0:
                        damaged += damage_newest(folder / "run")
                    continue
                if code == 2:  # a refusal: one line, then resumed again
                    refused += 1
                    lines = [x for x in err.splitlines() if x.startswith("error:")]
                    said = lines[-1] if lines else err[-300:]
                    print(f"    {name}: refused after kill {killed}: {said}", flush=True)
                    if len(lines) != 1 or "Traceback" in err:
                        bad_refusals.append(err[-500:])
                    if refused > 3:  # it refuses for good: the last run below says why
                        break
                    continue
                if code != 0:
                    raise RuntimeError(f"{name}: exit {code}\n{err[-3000:]}")
                break  # it finished before its kill: no more kills
        code, err = finish(launch(command, cfg, log))
        lines = [x for x in err.splitlines() if x.startswith("error:")]
        if arm == "killed" and code == 2 and len(lines) == 1 and "Traceback" not in err:
            result |= {"kills": killed, "refused": refused + 1, "damaged": damaged,
                       "bad_refusals": bad_refusals, "killed_s": time.monotonic() - started,
                       "same": None, "final_refusal": lines[0]}
            return result  # it cannot go on and says what was lost: an allowed end
        if code != 0:
            raise RuntimeError(f"{name} ({arm}): exit {code}\n{err[-3000:]}")
        took = time.monotonic() - started
        result[arm] = records(folder / "run", url, f"e-{name}-{arm}" if streamed else None)
        if arm == "straight":
            result["span_s"] = took
        else:
            result |= {"kills": killed, "refused": refused, "damaged": damaged,
                       "bad_refusals": bad_refusals, "killed_s": took}
    result["same"] = result["straight"] == result["killed"]
    if streamed:  # and every pushed prompt trained exactly once (its GROUP samples)
        result["same"] &= result["killed"]["stream prompts trained"] == [(GROUP, PROMPTS)]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill moments")
    parser.add_argument("--only", nargs="*", default=list(COMMANDS), choices=list(COMMANDS))
    parser.add_argument("--latest", type=float, default=0.9, help="kills fall within this "
                        "share of the straight run's duration (lower: more kills before the "
                        "run ends)")
    args = parser.parse_args()
    server = RedisServer().start()
    ok = True
    try:
        with tempfile.TemporaryDirectory(prefix="kill-resume-") as tmp:
            print(f"{'command':15}{'kills':>6}{'damaged':>8}{'refused':>8}{'straight s':>11}"
                  f"{'killed s':>9}  same records")
            for name in args.only:
                r = probe(name, args.kills, args.seed, Path(tmp), server.url, args.latest)
                ok &= r["same"] is not False and not r["bad_refusals"]
                same = "refused: " + r["final_refusal"] if r["same"] is None else r["same"]
                print(f"{name:15}{r['kills']:>6}{r['damaged']:>8}{r['refused']:>8}"
                      f"{r['span_s']:>11.0f}{r['killed_s']:>9.0f}  {same}", flush=True)
                if r["same"] is False:
                    for kind in r["straight"]:
                        if r["straight"][kind] != r["killed"][kind]:
                            print(f"    {kind}: straight {r['straight'][kind]!s:.300}\n"
                                  f"    {' ' * len(kind)}  killed   {r['killed'][kind]!s:.300}")
                for err in r["bad_refusals"]:
                    print(f"    refusal not one line: {err}")
    finally:
        server.stop()
    print("every killed run holds exactly the straight run's records:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
