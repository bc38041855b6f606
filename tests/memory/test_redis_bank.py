"""Redis backend against a real redis-server: sharing, following the log, outage buffering."""

from __future__ import annotations

import time

import numpy as np
import pytest
import redis

from agentrt.memory import open_bank
from agentrt.memory.errors import BackendUnavailableError, DimensionError
from agentrt.testing.redis_server import RedisServer


def redis_cfg(server: RedisServer, name: str = "shared", **extra) -> dict:
    return {"name": name, "backend": "redis",
            "redis": {"url": server.url, "retry_interval_s": 0.05, "connect_timeout_s": 0.5,
                      "socket_timeout_s": 1.0}, **extra}


def test_write_on_one_worker_is_read_by_another(redis_server):
    a = open_bank(redis_cfg(redis_server))
    b = open_bank(redis_cfg(redis_server))
    rid = a.write("the exit is behind the blue door", policy_id="alice", env="maze")
    hits = b.query("where is the exit", k=1)
    assert hits and hits[0].id == rid and hits[0].record.env == "maze"
    assert np.allclose(b.store.vector(rid), a.store.vector(rid))
    assert b.delete(rid) == 1
    assert a.count() == 0 and a.query("exit blue door", k=3) == []
    a.close()
    b.close()


def test_new_worker_loads_existing_records_and_follows(redis_server):
    a = open_bank(redis_cfg(redis_server))
    ids = a.write_many([{"text": f"fact number {i}", "policy_id": "p"} for i in range(1200)])
    a.delete(ids[:100])
    late = open_bank(redis_cfg(redis_server))
    assert late.count() == 1100 and {r.id for r in late.records()} == set(ids[100:])
    more = a.write("a fact written after the late worker joined", policy_id="p")
    assert late.get([more])[0] is not None
    raw = redis.Redis.from_url(redis_server.url)
    assert raw.hlen("agentrt:memory:shared:records") == 1101
    raw.close()
    a.close()
    late.close()


def test_password_url_and_wrong_password():
    with RedisServer(password="s3cret-pw") as server:
        bank = open_bank(redis_cfg(server, name="auth"))
        bank.write("guarded memory", policy_id="p")
        assert bank.count() == 1
        bank.close()
        wrong = server.url.replace("s3cret-pw", "nope")
        with pytest.raises(BackendUnavailableError) as err:
            open_bank({"name": "auth", "backend": "redis", "redis": {"url": wrong}})
        assert "credentials" in str(err.value) and "nope" not in str(err.value)
        # The password field overrides a URL without one.
        bare = f"redis://127.0.0.1:{server.port}/0"
        other = open_bank({"name": "auth", "backend": "redis",
                           "redis": {"url": bare, "password": "s3cret-pw"}})
        assert other.count() == 1
        other.close()


def test_dimension_mismatch_between_workers(redis_server):
    open_bank(redis_cfg(redis_server, dim=64)).close()
    with pytest.raises(DimensionError, match="64-d"):
        open_bank(redis_cfg(redis_server, dim=128))


def test_kill_and_restart_during_1000_writes(redis_server):
    bank = open_bank(redis_cfg(redis_server, name="crash"))
    ids: list[str] = []
    buffered_while_down = 0
    for i in range(1000):
        if i == 300:
            redis_server.kill()
        if i == 650:
            redis_server.start()  # same port, same AOF folder
        ids.append(bank.write(f"write {i}: outcome {i % 7}", policy_id=f"p{i % 3}", tags=[str(i)]))
        if 300 <= i < 650:
            buffered_while_down = max(buffered_while_down, bank.pending)
            if i == 400:  # reads keep working from the local copy while Redis is down
                hit = bank.query("write 350", k=1, filters={"tags": ["350"]})
                assert hit[0].record.text.startswith("write 350:")
    assert buffered_while_down >= 300  # the outage really happened and writes were queued
    bank.flush(timeout_s=20)
    assert bank.pending == 0
    raw = redis.Redis.from_url(redis_server.url)
    keys = "agentrt:memory:crash"
    stored = {k.decode() for k in raw.hkeys(f"{keys}:records")}
    assert len(ids) == len(set(ids)) == 1000 and stored == set(ids)
    puts = [f for _, f in raw.xrange(f"{keys}:log") if f[b"op"] == b"put"]
    assert len(puts) == 1000 and len({f[b"id"] for f in puts}) == 1000  # none twice
    raw.close()
    fresh = open_bank(redis_cfg(redis_server, name="crash"))
    assert fresh.count() == 1000 and {r.id for r in fresh.records()} == set(ids)
    fresh.close()
    bank.close()


def test_restarted_server_keeps_data_without_client_help(redis_server):
    bank = open_bank(redis_cfg(redis_server, name="durable"))
    ids = bank.write_many([{"text": f"durable {i}", "policy_id": "p"} for i in range(50)])
    bank.close()
    redis_server.restart()  # SIGKILL then start: only the AOF brings the data back
    again = open_bank(redis_cfg(redis_server, name="durable"))
    assert {r.id for r in again.records()} == set(ids)
    again.close()


def test_two_ray_workers_see_each_others_writes_within_one_second(ray_session, redis_server):
    ray = ray_session

    # Defined inside the test so Ray ships the class by value (the test module is not importable
    # from worker processes); the logic is the plain bank API.
    @ray.remote(num_cpus=0)
    class Worker:
        def __init__(self, cfg: dict) -> None:
            from agentrt.memory import open_bank

            self.bank = open_bank(cfg)

        def write(self, text: str) -> str:
            return self.bank.write(text, policy_id="w", visibility="shared")

        def wait_for(self, text: str, rec_id: str, timeout_s: float) -> float | None:
            start = time.monotonic()
            while time.monotonic() - start < timeout_s:
                if rec_id in {h.id for h in self.bank.query(text, k=3)}:
                    return time.monotonic() - start
                time.sleep(0.01)
            return None

    cfg = redis_cfg(redis_server, name="ray")
    w1, w2 = Worker.remote(cfg), Worker.remote(cfg)
    ray.get([w1.__ray_ready__.remote(), w2.__ray_ready__.remote()])
    for n, (src, dst) in enumerate([(w1, w2), (w2, w1), (w1, w2)]):
        text = f"opponent {n} always folds to a raise on the river"
        rec_id = ray.get(src.write.remote(text))
        waited = ray.get(dst.wait_for.remote(text, rec_id, 1.0))
        assert waited is not None, f"record {n} was not visible on the other worker within 1 s"
    for w in (w1, w2):
        ray.kill(w)


def make_certs(folder) -> tuple[str, str, str]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    import shutil
    import subprocess

    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl not found on PATH; `make test` installs it with redis-server",
                    pytrace=False)
    f = {n: str(folder / n) for n in ("ca.key", "ca.crt", "s.key", "s.csr", "s.crt", "san.ext")}
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for cmd in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f["ca.key"], "-out",
         f["ca.crt"], "-days", "2", "-subj", "/CN=agentrt test CA"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", f["s.key"], "-out", f["s.csr"],
         "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", f["s.csr"], "-CA", f["ca.crt"], "-CAkey", f["ca.key"],
         "-CAcreateserial", "-out", f["s.crt"], "-days", "2", "-extfile", f["san.ext"]],
    ):
        subprocess.run([openssl, *cmd], check=True, capture_output=True)
    return f["s.crt"], f["s.key"], f["ca.crt"]


def test_tls_connection_with_ca_file(tmp_path):
    cert, key, ca = make_certs(tmp_path)
    with RedisServer(tls=(cert, key, ca), password="pw") as server:
        assert server.url.startswith("rediss://")
        bank = open_bank({"name": "tls", "backend": "redis",
                          "redis": {"url": server.url, "tls_ca_certs": ca}})
        rid = bank.write("sent over TLS", policy_id="p")
        bank.close()
        # Same server through the `tls` switch and a redis:// URL.
        plain_url = server.url.replace("rediss://", "redis://")
        again = open_bank({"name": "tls", "backend": "redis",
                           "redis": {"url": plain_url, "tls": True, "tls_ca_certs": ca}})
        assert again.get([rid])[0].text == "sent over TLS"
        again.close()
        # Without the CA the server certificate cannot be verified: one clear error.
        with pytest.raises(BackendUnavailableError, match="tls_ca_certs"):
            open_bank({"name": "tls", "backend": "redis",
                       "redis": {"url": server.url, "connect_timeout_s": 1}})
        # Plain TCP to a TLS port: one clear error, not a hang.
        with pytest.raises(BackendUnavailableError):
            open_bank({"name": "tls", "backend": "redis",
                       "redis": {"url": plain_url, "connect_timeout_s": 1, "socket_timeout_s": 1}})


def test_trimmed_log_makes_an_idle_worker_reload(redis_server):
    cfg = redis_cfg(redis_server, name="trim")
    cfg["redis"]["log_retention_s"] = 0.001
    writer, idle = open_bank(cfg), open_bank(cfg)
    ids = writer.write_many([{"text": f"note {i}", "policy_id": "p"} for i in range(50)])
    writer.delete(ids[:10])  # a delete the idle worker must not miss
    time.sleep(0.01)
    assert writer.trim_log() > 0
    raw = redis.Redis.from_url(redis_server.url)
    assert raw.xlen("agentrt:memory:trim:log") == 0  # the log is bounded
    raw.close()
    assert idle.count() == 40 and {r.id for r in idle.records()} == set(ids[10:])
    late = open_bank(cfg)  # joins after the trim: loads from the hash, then follows normally
    assert late.count() == 40
    new = writer.write("after the trim", policy_id="p")
    assert late.get([new])[0] is not None and idle.get([new])[0] is not None
    for bank in (writer, idle, late):
        bank.close()


def test_concurrent_writers_in_one_worker(redis_server):
    import threading

    bank = open_bank(redis_cfg(redis_server, name="threads"))
    written: list[str] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        for i in range(100):
            rid = bank.write(f"thread {w} note {i}", policy_id=f"p{w}")
            with lock:
                written.append(rid)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    other = open_bank(redis_cfg(redis_server, name="threads"))
    assert len(set(written)) == 400 and bank.count() == 400
    assert {r.id for r in other.records()} == set(written)
    assert other.count({"policy_id": "p2"}) == 100
    bank.close()
    other.close()


def test_kill_while_a_writer_thread_runs_loses_and_duplicates_nothing(redis_server):
    import threading

    bank = open_bank(redis_cfg(redis_server, name="race"))
    ids: list[str] = []
    done = threading.Event()

    def run() -> None:
        for i in range(1000):
            ids.append(bank.write(f"step {i}", policy_id="p"))
        done.set()

    thread = threading.Thread(target=run)
    thread.start()
    while len(ids) < 250:  # kill mid-run, whatever call is in flight at that moment
        time.sleep(0.001)
    redis_server.kill()
    while len(ids) < 500 and not done.is_set():
        time.sleep(0.001)
    assert bank.pending > 0
    redis_server.start()
    thread.join(timeout=60)
    assert done.is_set()
    bank.flush(timeout_s=20)
    raw = redis.Redis.from_url(redis_server.url)
    assert {k.decode() for k in raw.hkeys("agentrt:memory:race:records")} == set(ids)
    assert raw.xlen("agentrt:memory:race:log") == 1000 == len(set(ids))
    raw.close()
    bank.close()
