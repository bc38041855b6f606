"""FAISS backend: API, filters, index kinds, persistence across restarts, thread safety."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from agentrt.memory import open_bank
from agentrt.memory.config import bank_config
from agentrt.memory.faiss_bank import FaissBank

DIM = 32


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    x = rng.normal(size=(n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def fill(bank, vecs, policies=("a", "b", "c"), envs=("e0", "e1")):
    items = [
        dict(text=f"record {i}", policy_id=policies[i % len(policies)], env=envs[i % len(envs)],
             episode_id=f"ep{i // 10}", tags=("even",) if i % 2 == 0 else ("odd",),
             visibility="private" if i % 5 == 0 else "shared", time=1000.0 + i, embedding=v)
        for i, v in enumerate(vecs)
    ]
    return bank.write_many(items)


def exact_ids(vecs, ids, keep, q, k):
    rows = [i for i in range(len(ids)) if keep(i)]
    scores = vecs[rows] @ q
    return [ids[rows[j]] for j in np.argsort(-scores, kind="stable")[:k]]


def test_write_query_get_delete_count(tmp_path):
    bank = open_bank({"name": "notes"}, run_dir=tmp_path)
    a = bank.write("the vault door code is 4512", policy_id="alice", env="vault", tags=["fact"])
    b = bank.write("bob opens with rock", policy_id="alice", env="rps")
    bank.write("weather is sunny", policy_id="carol")
    hits = bank.query("what is the door code of the vault", k=2)
    assert hits[0].id == a and hits[0].score > hits[1].score
    assert bank.get([a, "missing"])[0].text == "the vault door code is 4512"
    assert bank.get(["missing"]) == [None]
    assert bank.count() == 3 and bank.count({"policy_id": "alice"}) == 2
    assert bank.delete([b, "missing"]) == 1
    assert bank.count() == 2 and b not in {h.id for h in bank.query("bob rock", k=5)}
    assert (tmp_path / "memory" / "notes").is_dir()
    bank.close()


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_filtered_search_matches_exact_search(kind):
    rng = np.random.default_rng(0)
    vecs = unit(rng, 3000)
    bank = FaissBank(bank_config(name="f", dim=DIM, index={"kind": kind, "hnsw_ef_search": 200,
                                                            "ivf_nprobe": 64}))
    ids = fill(bank, vecs)
    assert bank.store.kind == kind
    pol = ["abc"[i % 3] for i in range(3000)]
    checks = [
        ({}, None, lambda i: True),
        ({"policy_id": "b"}, None, lambda i: pol[i] == "b"),
        ({"env": ["e0"], "tags": ["even"]}, None, lambda i: i % 2 == 0),
        ({"since": 1500.0, "until": 1600.0}, None, lambda i: 500 <= i <= 600),
        ({"id": ids[7]}, None, lambda i: i == 7),
        ({}, "a", lambda i: i % 5 != 0 or pol[i] == "a"),
    ]
    for filters, reader, keep in checks:
        for q in unit(rng, 5):
            got = [h.id for h in bank.query(vector=q, k=10, filters=filters, reader=reader)]
            want = exact_ids(vecs, ids, keep, q, 10)
            overlap = len(set(got) & set(want)) / len(want)
            assert overlap >= (1.0 if kind == "flat" else 0.8), (filters, reader, overlap)
            recs = bank.get(got)
            assert all(keep(ids.index(r.id)) for r in recs), (filters, reader)


def test_privacy_reader_never_sees_others_private_records():
    bank = FaissBank(bank_config(name="p"))
    secret = bank.write("alice's plan: bluff on every king", policy_id="alice",
                        visibility="private")
    bank.write("kings are strong cards", policy_id="bob", visibility="shared")
    as_bob = {h.id for h in bank.query("alice plan bluff king", k=10, reader="bob")}
    as_alice = {h.id for h in bank.query("alice plan bluff king", k=10, reader="alice")}
    assert secret not in as_bob and secret in as_alice
    assert bank.count(reader="bob") == 1 and bank.count(reader="alice") == 2


def test_auto_index_switches_to_hnsw_and_deletes_compact():
    rng = np.random.default_rng(1)
    cfg = bank_config(name="auto", dim=DIM, index={"kind": "auto", "auto_threshold": 300})
    bank = FaissBank(cfg)
    ids = fill(bank, unit(rng, 300))
    assert bank.store.kind == "flat"
    ids += fill(bank, unit(rng, 100))
    assert bank.store.kind == "hnsw" and bank.count() == 400
    gone = set(ids[::2])
    assert bank.delete(sorted(gone)) == 200
    # Past rebuild_dead_fraction the rows were compacted: no tombstones are left.
    assert len(bank.store._rows) == 200
    for q in unit(rng, 10):
        assert not gone & {h.id for h in bank.query(vector=q, k=20)}


def test_survives_restart_with_log_and_snapshots(tmp_path):
    cfg = bank_config(name="p", dim=DIM, snapshot_every=7, index={"kind": "hnsw"})
    rng = np.random.default_rng(2)
    vecs = unit(rng, 50)
    bank = FaissBank(cfg, tmp_path)
    ids = [bank.write(f"memory {i}", policy_id="a", embedding=v) for i, v in enumerate(vecs)]
    bank.delete(ids[:5])
    q = vecs[20]
    before = [(h.id, h.score) for h in bank.query(vector=q, k=5)]
    bank.close()
    assert (tmp_path / "CURRENT").exists()
    assert len(list(tmp_path.glob("snap-*"))) == 1 and len(list(tmp_path.glob("wal-*"))) == 1
    again = FaissBank(cfg, tmp_path)
    assert again.count() == 45 and {r.id for r in again.records()} == set(ids[5:])
    assert [(h.id, h.score) for h in again.query(vector=q, k=5)] == before
    assert np.allclose(again.store.vector(ids[20]), vecs[20])
    again.close()


def test_torn_log_line_is_dropped_and_bank_stays_writable(tmp_path):
    cfg = bank_config(name="t", dim=DIM)
    bank = FaissBank(cfg, tmp_path)
    ids = fill(bank, unit(np.random.default_rng(3), 10))
    bank.close()
    (wal,) = tmp_path.glob("wal-*.jsonl")
    with open(wal, "a") as fh:
        fh.write('{"op": "put", "records": [{"id": "half')  # a crash mid-append
    bank = FaissBank(cfg, tmp_path)
    assert {r.id for r in bank.records()} == set(ids)
    vec = unit(np.random.default_rng(4), 1)[0]
    new = bank.write("after the crash", policy_id="a", embedding=vec)
    bank.close()
    assert FaissBank(cfg, tmp_path).get([new])[0].text == "after the crash"


def test_snapshot_and_restore(tmp_path):
    rng = np.random.default_rng(5)
    bank = FaissBank(bank_config(name="s", dim=DIM), tmp_path / "bank")
    ids = fill(bank, unit(rng, 40))
    snap = bank.snapshot(tmp_path / "ckpt" / "s")
    bank.delete(ids[:10])
    extra = fill(bank, unit(rng, 5), policies=("z",))
    bank.restore(snap)
    assert {r.id for r in bank.records()} == set(ids)
    assert not set(extra) & {r.id for r in bank.records()}
    fresh = FaissBank(bank_config(name="s2", dim=DIM))
    fresh.restore(snap)
    q = unit(rng, 1)[0]
    assert [h.id for h in fresh.query(vector=q, k=5)] == [h.id for h in bank.query(vector=q, k=5)]
    bank.close()
    reopened = FaissBank(bank_config(name="s", dim=DIM), tmp_path / "bank")
    assert reopened.count() == 40


def test_concurrent_writers_in_one_process(tmp_path):
    cfg = bank_config(name="c", snapshot_every=150)
    bank = FaissBank(cfg, tmp_path)
    written: list[list[str]] = [[] for _ in range(6)]
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            for i in range(100):
                written[w].append(bank.write(f"worker {w} item {i}", policy_id=f"p{w}"))
                if i % 10 == 0:
                    bank.query(f"worker {w}", k=3)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    all_ids = [i for ids in written for i in ids]
    assert len(set(all_ids)) == 600 and bank.count() == 600
    bank.close()
    again = FaissBank(cfg, tmp_path)
    assert {r.id for r in again.records()} == set(all_ids)
    assert again.count({"policy_id": "p3"}) == 100


def test_hnsw_recall_at_10_against_flat_is_at_least_095():
    rng = np.random.default_rng(7)
    dim = 64
    centres = rng.normal(size=(200, dim)).astype(np.float32)
    # Clustered like sentence embeddings: nearest neighbours have cosine ~0.5, not ~1.
    pts = centres[rng.integers(0, 200, 5200)] + rng.normal(size=(5200, dim)).astype(np.float32)
    pts /= np.linalg.norm(pts, axis=1, keepdims=True)
    data, queries = pts[:5000], pts[5000:]
    banks = {kind: FaissBank(bank_config(name=kind, dim=dim, index={"kind": kind}))
             for kind in ("flat", "hnsw")}
    items = [{"text": f"r{i}", "policy_id": "p", "id": f"r{i}", "embedding": v}
             for i, v in enumerate(data)]
    for bank in banks.values():
        bank.write_many(items)
    assert banks["hnsw"].store.kind == "hnsw"
    recalls = []
    for q in queries:
        exact = {h.id for h in banks["flat"].query(vector=q, k=10)}
        approx = {h.id for h in banks["hnsw"].query(vector=q, k=10)}
        recalls.append(len(exact & approx) / 10)
    assert np.mean(recalls) >= 0.95, np.mean(recalls)


def test_a_folder_that_is_not_a_bank_is_refused_and_left_as_it_was(tmp_path):
    """Issue 41 (1): a bank's path naming an existing folder of other files (a home folder, a
    repository) is refused before anything is written, and none of its files is touched."""
    from agentrt.memory.errors import MemoryBankError

    home = tmp_path / "home"
    for name in (".git/HEAD", ".ssh/id_ed25519", ".env", "snap-notes.txt", "wal-2024.jsonl"):
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(name)
    before = sorted(p.relative_to(home) for p in home.rglob("*"))
    with pytest.raises(MemoryBankError, match="holds other files and no bank.json"):
        FaissBank(bank_config(name="b", dim=DIM), home)
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before
    assert all((home / n).read_text() == n for n in (".env", ".git/HEAD", "snap-notes.txt"))


def test_stale_cleanup_removes_only_what_a_bank_writes(tmp_path):
    """A crash mid-rotation leaves an old snapshot, log and temporary files: they go on reopen;
    a user's files in the bank folder (dot-files, look-alike names) stay."""
    cfg = bank_config(name="c", dim=DIM)
    bank = FaissBank(cfg, tmp_path)
    ids = fill(bank, unit(np.random.default_rng(7), 6))
    bank.checkpoint()
    bank.close()
    stale_dirs = ["snap-000000000000", ".snap-000000000009.0a1b2c3d.tmp",
                  ".snap-000000000002.12345678.old"]
    stale_files = [".CURRENT.deadbeef.tmp", ".bank.json.0badc0de.tmp", "wal-000000000000.jsonl"]
    mine = [".keep", ".envrc", "snap-backup", "wal-notes.jsonl", ".CURRENT.tmp"]
    for name in stale_dirs:
        (tmp_path / name).mkdir()
    for name in stale_files:
        (tmp_path / name).write_text("")
    for name in mine:
        (tmp_path / name).write_text("mine")
    stale = stale_dirs + stale_files
    again = FaissBank(cfg, tmp_path)
    assert {r.id for r in again.records()} == set(ids)
    assert not [n for n in stale if (tmp_path / n).exists()]
    assert all((tmp_path / n).read_text() == "mine" for n in mine)
    again.close()
