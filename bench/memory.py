"""Memory-bank benchmark: query latency and write throughput next to brute-force numpy.

For each bank size (10k and 100k records by default) it builds, on the same synthetic embeddings,
a FAISS flat bank, a FAISS HNSW bank (and IVF), and a Redis bank against a real redis-server on
127.0.0.1 (AOF with fsync on every write, as the tests run it). It reports

* writes/s: single ``write`` calls (first 1,000 records) and ``write_many`` batches of 1,000;
* query p50/p99 in ms for ``query(vector=q, k=10)`` after a warm-up, every query alone;
* the same search done by brute-force numpy (``vecs @ q`` + argpartition) in the same run, and
  the ratio numpy_p50 / bank_p50 (>1: the bank is faster);
* recall@10 of HNSW (and IVF) against the exact flat bank on the same queries.

Data: unit vectors drawn around 1,000 random centres (a mixture, like real sentence embeddings,
which cluster by topic), so approximate indexes face a realistic neighbour structure.

Run:  .venv/bin/python bench/memory.py            (about 3-4 minutes on 2 cores)
      .venv/bin/python bench/memory.py --sizes 10000 --queries 100   (quick look)
"""

from __future__ import annotations

import argparse
import os

# One thread for numpy's BLAS and for FAISS's OpenMP, in writes and queries alike: a query is
# one small matrix-vector product, and on a shared 2-core machine spinning thread pools make
# every call wait for a core (measured here: 10x slower single queries with 2 threads).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np  # noqa: E402

from agentrt.memory import open_bank
from agentrt.memory.config import bank_config
from agentrt.memory.faiss_bank import FaissBank
from agentrt.testing.redis_server import RedisServer


def make_data(n: int, n_queries: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors [n, dim] and queries [n_queries, dim] from a 1,000-centre mixture."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(1000, dim)).astype(np.float32)

    def draw(m: int) -> np.ndarray:
        noise = rng.normal(size=(m, dim)).astype(np.float32)
        x = centres[rng.integers(0, 1000, m)] + noise  # neighbours' cosine ~0.5, like MiniLM's
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    return draw(n), draw(n_queries)


def percentiles(times_s: list[float]) -> tuple[float, float]:
    ms = np.asarray(times_s) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def time_queries(search, queries: np.ndarray, warmup: int) -> tuple[list[float], list]:
    """Runs ``search(q)`` on warm-up queries untimed, then times each remaining query alone."""
    for q in queries[:warmup]:
        search(q)
    times, results = [], []
    for q in queries[warmup:]:
        t0 = time.perf_counter()
        results.append(search(q))
        times.append(time.perf_counter() - t0)
    return times, results


def numpy_search(vecs: np.ndarray, ids: list[str], k: int):
    def search(q: np.ndarray) -> list[str]:
        scores = vecs @ q
        top = np.argpartition(-scores, k)[:k]
        return [ids[i] for i in top[np.argsort(-scores[top])]]
    return search


def fill(bank, vecs: np.ndarray, single: int, batch: int) -> tuple[list[str], float, float]:
    """Writes every vector; returns (ids, single writes/s, batched writes/s)."""
    items = [{"text": f"memory {i}", "policy_id": f"p{i % 8}", "env": f"e{i % 3}",
              "embedding": v} for i, v in enumerate(vecs)]
    t0 = time.perf_counter()
    ids = [bank.write_many([it])[0] for it in items[:single]]
    single_rate = single / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for start in range(single, len(items), batch):
        ids += bank.write_many(items[start:start + batch])
    batch_rate = (len(items) - single) / (time.perf_counter() - t0)
    return ids, single_rate, batch_rate


def recall(approx: list[list[str]], exact: list[list[str]]) -> float:
    return float(np.mean([len(set(a) & set(e)) / len(e) for a, e in zip(approx, exact)]))


def bench_size(n: int, args: argparse.Namespace, server: RedisServer, folder: Path) -> list[dict]:
    vecs, queries = make_data(n, args.queries + args.warmup, args.dim, seed=n)
    rows = []
    backends = {
        "faiss-flat": {"backend": "faiss", "index": {"kind": "flat"}},
        "faiss-hnsw": {"backend": "faiss", "index": {"kind": "hnsw"}},
        "faiss-ivf": {"backend": "faiss", "index": {"kind": "ivf"}},
        "redis(auto)": {"backend": "redis", "redis": {"url": server.url, "socket_timeout_s": 30}},
    }
    ids_numpy = None
    exact = None
    for name, extra in backends.items():
        started = time.perf_counter()
        cfg = bank_config(name=f"b{n}-{name.split('(')[0]}", dim=args.dim, **extra)
        bank = FaissBank(cfg, folder / cfg.name) if cfg.backend == "faiss" else open_bank(cfg)
        ids, single_rate, batch_rate = fill(bank, vecs, args.single, args.batch)
        times, results = time_queries(lambda q: [h.id for h in bank.query(vector=q, k=10)],
                                      queries, args.warmup)
        if ids_numpy is None:  # numpy on the same data, timed in the same run
            np_times, np_results = time_queries(numpy_search(vecs, ids, 10), queries, args.warmup)
            rows.append({"n": n, "backend": "numpy brute force", "single": None, "batch": None,
                         "p50": percentiles(np_times)[0], "p99": percentiles(np_times)[1],
                         "recall": None})
            ids_numpy, exact = ids, np_results
        # Recall against exact search: map this bank's ids back to row numbers first.
        row_of = {rid: i for i, rid in enumerate(ids)}
        as_rows = [[ids_numpy[row_of[r]] for r in res] for res in results]
        p50, p99 = percentiles(times)
        rows.append({"n": n, "backend": name, "single": single_rate, "batch": batch_rate,
                     "p50": p50, "p99": p99, "recall": recall(as_rows, exact),
                     "kind": bank.store.kind})
        bank.close()
        print(f"  {name} at {n:,} records: {time.perf_counter() - started:.0f} s", flush=True)
    return rows


def main() -> None:
    import faiss

    faiss.omp_set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--dim", type=int, default=256, help="Embedding size (hashing: 256).")
    parser.add_argument("--queries", type=int, default=300, help="Timed queries per bank.")
    parser.add_argument("--warmup", type=int, default=30, help="Untimed queries first.")
    parser.add_argument("--single", type=int, default=1000, help="Records written one by one.")
    parser.add_argument("--batch", type=int, default=1000, help="Records per write_many.")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-memory-"))
    rows: list[dict] = []
    try:
        with RedisServer(folder=folder / "redis") as server:
            for n in args.sizes:
                rows += bench_size(n, args, server, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if not report(rows, args):
        raise SystemExit(1)


def report(rows: list[dict], args: argparse.Namespace) -> bool:
    """Prints the table; returns False when HNSW recall@10 falls below 0.95."""
    print(f"\nmemory bench: dim {args.dim}, k=10, {args.queries} timed queries after "
          f"{args.warmup} warm-up, writes: {args.single} single + batches of {args.batch}")
    head = (f"{'records':>8} {'backend':<18} {'index':<6} {'single w/s':>10} {'batch w/s':>10} "
            f"{'p50 ms':>8} {'p99 ms':>8} {'numpy/bank p50':>14} {'recall@10':>9}")
    print(head)
    print("-" * len(head))
    base = {r["n"]: r["p50"] for r in rows if r["backend"] == "numpy brute force"}
    for r in rows:
        fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
        ratio = base[r["n"]] / r["p50"]
        print(f"{r['n']:>8,} {r['backend']:<18} {r.get('kind', '-'):<6} "
              f"{fmt(r['single'], ',.0f'):>10} "
              f"{fmt(r['batch'], ',.0f'):>10} {r['p50']:>8.3f} {r['p99']:>8.3f} "
              f"{ratio:>13.2f}x {fmt(r['recall'], '.4f'):>9}")
    hnsw = [r["recall"] for r in rows if r.get("kind") == "hnsw"]
    ok = bool(hnsw) and min(hnsw) >= 0.95
    print(f"HNSW recall@10 vs exact: min {min(hnsw, default=float('nan')):.4f} "
          f"({'PASS' if ok else 'FAIL'}: needs >= 0.95)")
    return ok


if __name__ == "__main__":
    main()
