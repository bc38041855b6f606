"""Closed by default (docs/security.md): a Ray that agentrt starts listens on loopback only, and a
secret in the config never reaches a file of the run folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import redis
import yaml

from agentrt.testing.redis_server import RedisServer
from agentrt.runtime.ray_pool import LOOPBACK_ENV

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "pw-7f3c9e1d-never-in-files"

# Starts Ray the way every pool does, starts a 2-worker policy pool on it (data parallel: a gloo
# process group with its TCP store), then lists what this process and everything it started
# listen on (the GCS, raylet, agents, the driver's and both workers' core workers, the store and
# gloo's pairs).
LISTENERS = """
import json, sys, psutil
from agentrt.config.sections import ModelConfig, PolicyConfig, RuntimeConfig
from agentrt.policies.models import build_model
from agentrt.runtime.ray_pool import PolicyPool, ensure_ray

assert ensure_ray(RuntimeConfig(num_cpus=2))
import ray  # as a user script may: after agentrt started it

model = build_model("model", "llama-tiny", seed=0)
pool = PolicyPool(PolicyConfig(model=ModelConfig(path=str(model)),
                               resources={"num_workers": 2, "cpus_per_worker": 1}), seed=0)
assert pool.generate([[1, 2, 3]])  # the pool works
me = psutil.Process()
procs = [me, *me.children(recursive=True)]
found = [[p.pid, p.name(), c.laddr.ip, c.laddr.port] for p in procs
         for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
print(json.dumps({"workers": pool.pids, "listening": found}))
pool.shutdown()
ray.shutdown()
"""


def is_loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip in ("::1", "::ffff:127.0.0.1")


def test_a_ray_run_with_two_workers_listens_on_loopback_only(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != LOOPBACK_ENV}
    proc = subprocess.run([sys.executable, "-c", LISTENERS], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    listening = out["listening"]
    names = {name for _, name, _, _ in listening}
    assert {"gcs_server", "raylet"} <= names, listening
    rank0 = {port for pid, _, _, port in listening if pid == out["workers"][0]}
    assert len(rank0) >= 3, listening  # core worker, the process group's store, gloo
    exposed = [x for x in listening if not is_loopback(x[2])]
    assert exposed == [], f"listening beyond loopback: {exposed}"


def test_redis_password_never_reaches_a_file_of_the_run_folder(tmp_path):
    with RedisServer(password=PASSWORD) as server:
        run = tmp_path / "run"
        config = yaml.safe_load((ROOT / "examples" / "recall_memory_league.yaml").read_text())
        config |= {"run_dir": str(run), "progress": False,
                   "train": {"steps": 1, "games_per_step": 4},
                   "eval": {"every": 1, "games": 2, "opponents": []},
                   "checkpoint": {"every": 1}}
        config["memory"]["banks"]["recall"] = {"backend": "redis", "embedder": "hashing",
                                               "redis": {"url": server.url}}
        config["policies"][0] |= {"model": {"preset": "llama-nano"}}
        config["policies"][0]["memory"]["backend"] = "redis"
        (tmp_path / "league.yaml").write_text(yaml.safe_dump(config))
        proc = subprocess.run([sys.executable, "-m", "agentrt.cli", "tournament", "run",
                               str(tmp_path / "league.yaml")], capture_output=True, text=True,
                              cwd=tmp_path, timeout=600)
        assert proc.returncode == 0, proc.stderr
        stored = redis.Redis.from_url(server.url).hlen("agentrt:memory:recall:records")
    assert stored > 0  # the bank behind the password was really used
    files = [p for p in run.rglob("*") if p.is_file()]
    assert {"config.yaml", "metrics.jsonl", "report.html"} <= {p.name for p in files}
    assert any("checkpoints" in p.parts for p in files)
    leaked = [str(p.relative_to(run)) for p in files if PASSWORD.encode() in p.read_bytes()]
    assert leaked == []
    assert PASSWORD not in proc.stdout + proc.stderr
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["memory"]["banks"]["recall"]["redis"]["url"].startswith("redis://:***@127.0.0.1")


def test_password_from_the_environment_connects_and_is_never_saved(monkeypatch):
    from agentrt.config.load import dump_config
    from agentrt.memory import open_bank
    from agentrt.memory.errors import MemoryBankError
    from agentrt.tournaments.run_config import TournamentRunConfig

    with RedisServer(password=PASSWORD) as server:
        bare = f"redis://127.0.0.1:{server.port}/0"
        bank = {"name": "envpw", "backend": "redis",
                "redis": {"url": bare, "password_env": "AGENTRT_TEST_REDIS_PW"}}
        monkeypatch.delenv("AGENTRT_TEST_REDIS_PW", raising=False)
        try:
            open_bank(bank)
            raise AssertionError("opened without the password")
        except MemoryBankError as exc:
            assert "AGENTRT_TEST_REDIS_PW" in str(exc) and "not set" in str(exc)
        monkeypatch.setenv("AGENTRT_TEST_REDIS_PW", PASSWORD)
        opened = open_bank(bank)
        opened.write("kept behind a password", policy_id="p")
        assert opened.count() == 1
        opened.close()
    cfg = TournamentRunConfig.model_validate({
        "envs": [{"id": "Recall-v0"}],
        "policies": [{"id": "lm", "memory": {"bank": "b", "backend": "redis"}}],
        "memory": {"banks": {"b": {"backend": "redis", "redis": {
            "url": f"redis://:{PASSWORD}@h:1/0?password={PASSWORD}", "password": PASSWORD}}}}})
    assert PASSWORD in cfg.memory.banks["b"].redis.url  # the run itself still has it
    assert PASSWORD not in dump_config(cfg)
