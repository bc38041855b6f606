"""Bad input gives one clear error and never corrupts the bank (in memory, on disk, in Redis)."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import redis

from agentrt.core.errors import AgentrtError
from agentrt.memory import open_bank
from agentrt.memory.config import bank_config
from agentrt.memory.errors import (BackendUnavailableError, DimensionError, FilterError,
                                   InvalidRecordError, MemoryBankError, QueryError)
from agentrt.memory.faiss_bank import FaissBank
from agentrt.testing.redis_server import free_port

DIM = 16


def bad_calls(bank):
    """(call, error type, words the message must contain) for every kind of bad input."""
    good = np.ones(DIM, dtype=np.float32)
    return [
        (lambda: bank.write("", policy_id="p"), InvalidRecordError, "empty"),
        (lambda: bank.write("   \n", policy_id="p"), InvalidRecordError, "empty"),
        (lambda: bank.write_many([{"text": "ok", "policy_id": "p"},
                                  {"text": "", "policy_id": "p"}]),
         InvalidRecordError, "empty"),
        (lambda: bank.query(""), QueryError, "empty"),
        (lambda: bank.write("x", policy_id="p", embedding=np.ones(DIM + 3)), DimensionError,
         f"{DIM + 3} dimensions"),
        (lambda: bank.write_many([{"text": "ok", "policy_id": "p", "embedding": good},
                                  {"text": "bad", "policy_id": "p", "embedding": [1.0, 2.0]}]),
         DimensionError, "2 dimensions"),
        (lambda: bank.query(vector=np.ones(DIM - 1)), DimensionError, f"length {DIM}"),
        (lambda: bank.query(vector=np.full(DIM, np.nan)), DimensionError, "NaN"),
        (lambda: bank.query(vector=np.zeros(DIM)), DimensionError, "zeros"),
        (lambda: bank.query("x", filters={"colour": "red"}), FilterError, "'colour'"),
        (lambda: bank.count({"colour": "red"}), FilterError, "valid fields"),
        (lambda: bank.query("x", filters={"policy_id": 3}), FilterError, "policy_id"),
        (lambda: bank.query("x", k=0), QueryError, "positive"),
        (lambda: bank.write("x", policy_id="p", visibility="public"), InvalidRecordError,
         "visibility"),
        (lambda: bank.write_many([{"text": "x", "policy_id": "p", "colour": 1}]),
         InvalidRecordError, "'colour'"),
    ]


def check_rejects_without_change(bank) -> None:
    before = sorted(r.id for r in bank.records())
    for call, error, words in bad_calls(bank):
        with pytest.raises(error) as info:
            call()
        msg = str(info.value)
        assert isinstance(info.value, AgentrtError) and words in msg and "\n" not in msg, msg
    assert sorted(r.id for r in bank.records()) == before


def seeded(bank):
    rng = np.random.default_rng(0)
    return bank.write_many([{"text": f"seed {i}", "policy_id": "p", "embedding": v}
                            for i, v in enumerate(rng.normal(size=(20, DIM)))])


def test_faiss_bank_rejects_bad_input_and_stays_intact(tmp_path):
    cfg = bank_config(name="bad", dim=DIM, snapshot_every=3)
    bank = FaissBank(cfg, tmp_path)
    ids = seeded(bank)
    check_rejects_without_change(bank)
    rid = bank.write("still works", policy_id="p")
    bank.close()
    again = FaissBank(cfg, tmp_path)
    assert {r.id for r in again.records()} == set(ids) | {rid}
    with pytest.raises(DimensionError, match="16-d"):
        FaissBank(bank_config(name="bad", dim=DIM * 2), tmp_path)  # reopening with another dim


def test_redis_bank_rejects_bad_input_and_stores_nothing(redis_server):
    cfg = {"name": "bad", "backend": "redis", "dim": DIM, "redis": {"url": redis_server.url}}
    bank = open_bank(cfg)
    seeded(bank)
    raw = redis.Redis.from_url(redis_server.url)
    before = (raw.hlen("agentrt:memory:bad:records"), raw.xlen("agentrt:memory:bad:log"))
    check_rejects_without_change(bank)
    assert (raw.hlen("agentrt:memory:bad:records"), raw.xlen("agentrt:memory:bad:log")) == before
    assert open_bank(cfg).count() == 20
    raw.close()
    bank.close()


def test_redis_url_that_refuses_gives_one_clear_error():
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"  # nothing listens there
    with pytest.raises(BackendUnavailableError) as info:
        open_bank({"name": "x", "backend": "redis",
                   "redis": {"url": url, "connect_timeout_s": 0.5}})
    msg = str(info.value)
    assert "did not answer" in msg and "127.0.0.1" in msg and "hunter2" not in msg, msg


def test_redis_url_that_never_replies_times_out_with_one_clear_error():
    # A socket that accepts connections but never answers, like a hung server.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        with pytest.raises(BackendUnavailableError, match="did not answer"):
            open_bank({"name": "x", "backend": "redis",
                       "redis": {"url": url, "connect_timeout_s": 0.3, "socket_timeout_s": 0.3}})


def test_bad_config_is_one_line_naming_the_field():
    cases = [
        ({"name": "x", "backend": "redis"}, "redis section"),
        ({"name": "x", "embedder": "word2vec"},
         "unknown embedder 'word2vec'; valid: hashing, minilm"),
        ({"name": "x", "index": {"kind": "lsh"}}, "index.kind"),
        ({"name": "x", "colour": 1}, "colour"),
        ({"name": "x", "backend": "redis", "redis": {"url": "http://h"}}, "redis://"),
        ({"name": "a/b"}, "name"),
    ]
    for data, words in cases:
        with pytest.raises(MemoryBankError) as info:
            open_bank(data)
        assert words in str(info.value) and "\n" not in str(info.value), str(info.value)
