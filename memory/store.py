"""In-process vector store: records, their vectors and a FAISS index, with filtered search.

Both backends keep one :class:`VectorStore` per process: the FAISS bank persists it in the run
folder, the Redis bank keeps it in step with the shared log. Rows are append-only; a deleted
row becomes a tombstone that searches skip, and the index is rebuilt (rows compacted) once
tombstones pass ``rebuild_dead_fraction``. That one rule serves every index kind, including HNSW,
which cannot remove vectors in place.

Vectors are L2-normalised float32, and the metric is inner product, i.e. cosine similarity.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from typing import Any, Iterable

import faiss
import numpy as np

from agentrt.memory.config import IndexConfig
from agentrt.memory.records import Filter, Record

# Filters whose candidate rows number at most this are answered by exact numpy search: cheaper
# than over-fetching from an approximate index, and exact.
EXACT_LIMIT = 8192
# IVF needs about this many training points per list to place its centroids well (FAISS warns).
_IVF_POINTS_PER_LIST = 39


def build_index(kind: str, dim: int, cfg: IndexConfig, vecs: np.ndarray) -> tuple[Any, str]:
    """A FAISS inner-product index of ``kind`` over ``vecs`` [n, dim] (row i gets id i).

    IVF needs training data; with fewer than 39 points per list it falls back to flat.

    Returns:
        (index, kind actually built)
    """
    n = len(vecs)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = cfg.hnsw_ef_construction
        index.hnsw.efSearch = cfg.hnsw_ef_search
    elif kind == "ivf":
        nlist = cfg.ivf_nlist or max(1, int(math.sqrt(max(n, 1))))
        if n < nlist * _IVF_POINTS_PER_LIST:
            return build_index("flat", dim, cfg, vecs)
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(vecs)
        index.nprobe = min(cfg.ivf_nprobe, nlist)
    else:
        index, kind = faiss.IndexFlatIP(dim), "flat"
    if n:
        index.add(vecs)
    return index, kind


class VectorStore:
    """Records + vectors + FAISS index. Thread-safe: every public method holds ``self.lock``.

    Args:
        dim: Embedding size.
        cfg: Index choice and parameters.
    """

    def __init__(self, dim: int, cfg: IndexConfig) -> None:
        self.dim = dim
        self.cfg = cfg
        self.lock = threading.RLock()
        self.clear()

    # ---- state -------------------------------------------------------------------------------
    def clear(self) -> None:
        with self.lock:
            self._vecs = np.zeros((1024, self.dim), dtype=np.float32)
            self._rows: list[Record | None] = []  # row -> record, None once deleted
            self._row_of: dict[str, int] = {}
            self._by_field: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
            self._trained_at = 0
            self._index, self.kind = build_index(self._want_kind(0), self.dim, self.cfg,
                                                 self._vecs[:0])

    def __len__(self) -> int:
        return len(self._row_of)

    def __contains__(self, rec_id: object) -> bool:
        return rec_id in self._row_of

    def get(self, rec_id: str) -> Record | None:
        row = self._row_of.get(rec_id)
        return None if row is None else self._rows[row]

    def records(self) -> list[Record]:
        with self.lock:
            return [r for r in self._rows if r is not None]

    def vector(self, rec_id: str) -> np.ndarray:
        with self.lock:
            return self._vecs[self._row_of[rec_id]].copy()

    def _want_kind(self, live: int) -> str:
        if self.cfg.kind != "auto":
            return self.cfg.kind
        return "flat" if live <= self.cfg.auto_threshold else "hnsw"

    def _index_fields(self, row: int, rec: Record, add: bool) -> None:
        keys = [("policy_id", rec.policy_id), ("episode_id", rec.episode_id), ("env", rec.env),
                ("visibility", rec.visibility), ("id", rec.id)]
        keys += [("tags", t) for t in rec.tags]
        for name, value in keys:
            bucket = self._by_field[name][value]
            if add:
                bucket.add(row)
            else:
                bucket.discard(row)
                if not bucket:
                    del self._by_field[name][value]

    # ---- writes ------------------------------------------------------------------------------
    def add(self, records: list[Record], vecs: np.ndarray) -> list[str]:
        """Appends records whose id is not yet present (idempotent); returns the ids added.

        Args:
            records: Validated records.
            vecs: float32 [len(records), dim], rows L2-normalised.
        """
        with self.lock:
            keep = [i for i, r in enumerate(records) if r.id not in self._row_of]
            seen: set[str] = set()
            keep = [i for i in keep if not (records[i].id in seen or seen.add(records[i].id))]
            if not keep:
                return []
            new = np.ascontiguousarray(vecs[keep], dtype=np.float32)
            start = len(self._rows)
            while start + len(keep) > len(self._vecs):  # amortised doubling
                self._vecs = np.concatenate([self._vecs, np.zeros_like(self._vecs)])
            self._vecs[start:start + len(keep)] = new
            for offset, i in enumerate(keep):
                self._rows.append(records[i])
                self._row_of[records[i].id] = start + offset
                self._index_fields(start + offset, records[i], add=True)
            if self._needs_rebuild():
                self.rebuild()
            else:
                self._index.add(new)
            return [records[i].id for i in keep]

    def remove(self, ids: Iterable[str]) -> list[str]:
        """Tombstones the given ids; returns those that were present."""
        with self.lock:
            gone = []
            for rec_id in ids:
                row = self._row_of.pop(rec_id, None)
                if row is None:
                    continue
                self._index_fields(row, self._rows[row], add=False)  # type: ignore[arg-type]
                self._rows[row] = None
                gone.append(rec_id)
            dead = len(self._rows) - len(self._row_of)
            if gone and dead > self.cfg.rebuild_dead_fraction * max(len(self._rows), 1):
                self.rebuild()
            return gone

    def _needs_rebuild(self) -> bool:
        live = len(self._row_of)
        want = self._want_kind(live)
        if want == "ivf":
            # IVF centroids are trained on the data: (re)train whenever the bank has grown 4x
            # since the last training, so they follow the data (flat serves it until then).
            return live >= max(4 * self._trained_at, 2048)
        return want != self.kind

    def rebuild(self) -> None:
        """Compacts rows (drops tombstones) and rebuilds the index from the stored vectors."""
        with self.lock:
            live_rows = [i for i, r in enumerate(self._rows) if r is not None]
            vecs = self._vecs[live_rows]
            recs = [self._rows[i] for i in live_rows]
            self.clear()
            cap = max(1024, 1 << (len(recs) - 1).bit_length()) if recs else 1024
            self._vecs = np.zeros((cap, self.dim), dtype=np.float32)
            self._vecs[:len(recs)] = vecs
            for row, rec in enumerate(recs):
                self._rows.append(rec)
                self._row_of[rec.id] = row  # type: ignore[union-attr]
                self._index_fields(row, rec, add=True)  # type: ignore[arg-type]
            self._index, self.kind = build_index(self._want_kind(len(recs)), self.dim, self.cfg,
                                                 vecs)
            self._trained_at = len(recs)

    # ---- reads -------------------------------------------------------------------------------
    def _candidates(self, flt: Filter, limit: int | None = EXACT_LIMIT) -> set[int] | None:
        """Rows that can match the indexed conditions, or None when they are not selective.

        With ``limit``, sets larger than it are never built (that costs a pass over them on every
        query): None then means "search the index and post-filter with ``Filter.matches``".
        """
        sets: list[set[int] | list[set[int]]] = []  # a list of sets is their union
        for name, values in flt.equals.items():
            sets.append([self._by_field[name].get(v, set()) for v in values])
        for tag in flt.tags:
            sets.append([self._by_field["tags"].get(tag, set())])
        if flt.reader is not None:
            sets.append([self._by_field["visibility"].get("shared", set()),
                         self._by_field["policy_id"].get(flt.reader, set())])
        if not sets:
            return None
        sizes = [sum(len(s) for s in group) for group in sets]
        best = min(range(len(sets)), key=sizes.__getitem__)
        if limit is not None and sizes[best] > limit:
            return None
        group = sets[best]
        rows = set(group[0]).union(*group[1:])
        # The other conditions are checked row by row by Filter.matches afterwards.
        return rows

    def _exact(
        self, q: np.ndarray, rows: list[int], k: int, flt: Filter
    ) -> list[tuple[int, float]]:
        rows = [r for r in rows if self._rows[r] is not None and flt.matches(self._rows[r])]
        if not rows:
            return []
        scores = self._vecs[rows] @ q  # [len(rows)]
        top = np.argsort(-scores, kind="stable")[:k]
        return [(rows[i], float(scores[i])) for i in top]

    def search(self, q: np.ndarray, k: int, flt: Filter) -> list[tuple[Record, float]]:
        """The k best records for the unit query ``q`` [dim] that pass ``flt``, best first."""
        with self.lock:
            live = len(self._row_of)
            if live == 0:
                return []
            cands = None if flt.empty else self._candidates(flt)
            if cands is not None:
                found = self._exact(q, sorted(cands), k, flt)
            else:
                found = self._search_index(q, k, flt)
            return [(self._rows[r], s) for r, s in found]  # type: ignore[misc]

    def _search_index(self, q: np.ndarray, k: int, flt: Filter) -> list[tuple[int, float]]:
        total = len(self._rows)
        dead = total - len(self._row_of)
        # Over-fetch for tombstones (at most rebuild_dead_fraction of rows) and for rows the
        # filter drops, then widen 4x at a time until k survive.
        alive = max(1.0 - dead / total, 0.05)
        fetch = min(total, int((k if flt.empty else 5 * k) / alive) + 8)
        while True:
            scores, rows = self._index.search(q[None, :], fetch)
            found = []
            for row, score in zip(rows[0].tolist(), scores[0].tolist()):
                rec = self._rows[row] if row >= 0 else None
                if rec is not None and (flt.empty or flt.matches(rec)):
                    found.append((row, score))
                    if len(found) == k:
                        return found
            if fetch >= total:
                break
            fetch = min(total, fetch * 4)
        if self.kind == "flat":
            return found  # a full flat scan is exact: fewer than k rows match
        # An approximate index may miss rows at full depth; fall back to an exact scan.
        cands = None if flt.empty else self._candidates(flt, limit=None)
        return self._exact(q, sorted(cands) if cands is not None else sorted(self._row_of.values()),
                           k, flt)

    def count(self, flt: Filter) -> int:
        with self.lock:
            if flt.empty:
                return len(self._row_of)
            cands = self._candidates(flt, limit=None)
            rows = cands if cands is not None else self._row_of.values()
            return sum(1 for r in rows if flt.matches(self._rows[r]))  # type: ignore[arg-type]

    # ---- persistence -------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything needed to rebuild this store exactly, index included (for snapshots)."""
        with self.lock:
            n = len(self._rows)
            return {
                "rows": [None if r is None else r.to_dict() for r in self._rows],
                "vectors": self._vecs[:n].copy(),
                "index": faiss.serialize_index(self._index),
                "kind": self.kind,
                "trained_at": self._trained_at,
            }

    def load_state(self, state: dict[str, Any]) -> None:
        """Replaces the contents with a :meth:`state` dict."""
        with self.lock:
            self.clear()
            vecs = np.asarray(state["vectors"], dtype=np.float32).reshape(-1, self.dim)
            cap = max(1024, 1 << max(len(vecs) - 1, 0).bit_length())
            self._vecs = np.zeros((cap, self.dim), dtype=np.float32)
            self._vecs[:len(vecs)] = vecs
            for row, data in enumerate(state["rows"]):
                rec = None if data is None else Record.from_dict(data)
                self._rows.append(rec)
                if rec is not None:
                    self._row_of[rec.id] = row
                    self._index_fields(row, rec, add=True)
            self._index = faiss.deserialize_index(np.asarray(state["index"], dtype=np.uint8))
            self.kind = state["kind"]
            self._trained_at = int(state.get("trained_at", 0))
            # Search-time settings follow the config, not the file.
            if self.kind == "hnsw":
                self._index.hnsw.efSearch = self.cfg.hnsw_ef_search
            elif self.kind == "ivf":
                self._index.nprobe = min(self.cfg.ivf_nprobe, self._index.nlist)
