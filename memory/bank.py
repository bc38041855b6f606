"""The MemoryBank API shared by both backends: validation, embedding, query, snapshot/restore.

A backend implements four hooks: :meth:`MemoryBank._commit_puts` and
:meth:`MemoryBank._commit_deletes` make a change durable (run-folder log or Redis) and apply it
to the local :class:`VectorStore`; :meth:`MemoryBank._sync` brings the local store up to date
before a read; :meth:`MemoryBank.close` releases resources. Every input is checked *before* a
hook runs, so a bad record, vector or filter raises a :class:`MemoryBankError` and changes nothing.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from agentrt.memory.config import BankConfig
from agentrt.memory.embedders import Embedder, build_embedder
from agentrt.memory.errors import DimensionError, InvalidRecordError, MemoryBankError, QueryError
from agentrt.memory.persist import read_snapshot, write_snapshot
from agentrt.memory.records import Hit, Record, make_record, parse_filter
from agentrt.memory.store import VectorStore

_RECORD_FIELDS = ("text", "policy_id", "episode_id", "env", "tags", "visibility", "time", "id",
                  "embedding")


class MemoryBank(ABC):
    """Stores records with embeddings and returns the nearest ones.

    Args:
        cfg: Validated bank config.
        embedder: Embedder to use instead of building ``cfg.embedder`` (e.g. one shared model).
    """

    def __init__(self, cfg: BankConfig, embedder: Embedder | None = None) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.embedder = embedder or build_embedder(cfg.embedder, cfg.dim)
        if cfg.dim is not None and self.embedder.dim != cfg.dim:
            raise MemoryBankError(
                f"bank {cfg.name!r}: embedder gives {self.embedder.dim}-d vectors but dim is "
                f"{cfg.dim}; make them agree"
            )
        self.dim = int(self.embedder.dim)
        self.store = VectorStore(self.dim, cfg.index)
        self.closed = False

    # ---- backend hooks -----------------------------------------------------------------------
    @abstractmethod
    def _commit_puts(self, records: list[Record], vecs: np.ndarray) -> None: ...

    @abstractmethod
    def _commit_deletes(self, ids: list[str]) -> None: ...

    def _sync(self) -> None:
        """Brings the local store up to date with shared state (no-op in-process)."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> MemoryBank:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- validation --------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise MemoryBankError(f"memory bank {self.name!r} is closed; open it again")

    def check_vector(self, vector: Any) -> np.ndarray:
        """Validates one vector and returns it L2-normalised, float32 [dim].

        Raises:
            DimensionError: wrong shape, non-finite values or all zeros.
        """
        try:
            arr = np.asarray(vector, dtype=np.float32)
        except (TypeError, ValueError):
            raise DimensionError(
                f"bank {self.name!r} needs a vector of {self.dim} numbers"
            ) from None
        if arr.ndim != 1 or arr.shape[0] != self.dim:
            got = arr.shape[0] if arr.ndim == 1 else f"shape {tuple(arr.shape)}"
            raise DimensionError(
                f"vector has {got} dimensions but bank {self.name!r} stores {self.dim}-d "
                f"embeddings ({self.cfg.embedder}); pass a vector of length {self.dim}"
            )
        if not np.all(np.isfinite(arr)):
            raise DimensionError(f"vector for bank {self.name!r} contains NaN or infinity")
        norm = float(np.linalg.norm(arr))
        if norm == 0.0 or not math.isfinite(norm):
            raise DimensionError(f"vector for bank {self.name!r} is all zeros; it has no direction")
        return arr / norm

    def _prepare(self, items: Sequence[Mapping[str, Any]]) -> tuple[list[Record], np.ndarray]:
        """Validates write items and embeds those without a vector (one batch)."""
        records: list[Record] = []
        vecs = np.zeros((len(items), self.dim), dtype=np.float32)
        to_embed: list[int] = []
        ids: set[str] = set()
        for i, item in enumerate(items):
            unknown = sorted(set(item) - set(_RECORD_FIELDS))
            if unknown:
                raise InvalidRecordError(
                    f"unknown memory record field {unknown[0]!r}; "
                    f"valid: {', '.join(_RECORD_FIELDS)}"
                )
            fields = {k: v for k, v in item.items() if k != "embedding"}
            if "text" not in fields or "policy_id" not in fields:
                raise InvalidRecordError("a memory record needs at least text and policy_id")
            rec = make_record(**fields)
            if rec.id in ids or rec.id in self.store:
                raise InvalidRecordError(
                    f"memory record id {rec.id!r} already exists in bank {self.name!r}"
                )
            ids.add(rec.id)
            records.append(rec)
            if item.get("embedding") is None:
                to_embed.append(i)
            else:
                vecs[i] = self.check_vector(item["embedding"])
        if to_embed:
            vecs[to_embed] = self._embed([records[i].text for i in to_embed])
        return records, vecs

    def _embed(self, texts: list[str]) -> np.ndarray:
        out = np.asarray(self.embedder.encode(texts), dtype=np.float32)
        if out.shape != (len(texts), self.dim):
            raise DimensionError(
                f"embedder {self.cfg.embedder!r} returned shape {out.shape}, expected "
                f"({len(texts)}, {self.dim})"
            )
        return out

    # ---- public API --------------------------------------------------------------------------
    def write(self, text: str, *, policy_id: str, embedding: Any = None, episode_id: str = "",
              env: str = "", tags: Sequence[str] = (), visibility: str = "shared",
              time: float | None = None, id: str | None = None) -> str:
        """Stores one record; returns its id. Embeds ``text`` unless ``embedding`` [dim] is given.

        Raises:
            InvalidRecordError: empty text, unknown visibility, duplicate id.
            DimensionError: ``embedding`` of the wrong length or not finite.
        """
        item = dict(text=text, policy_id=policy_id, embedding=embedding, episode_id=episode_id,
                    env=env, tags=tuple(tags), visibility=visibility, time=time, id=id)
        return self.write_many([item])[0]

    def write_many(self, items: Sequence[Mapping[str, Any]]) -> list[str]:
        """Stores several records at once (one embedding batch, one durable append).

        Args:
            items: Mappings with the keyword arguments of :meth:`write`.

        Returns:
            The new ids, in order. All items are validated before any is stored.
        """
        self._check_open()
        records, vecs = self._prepare(items)
        if records:
            self._commit_puts(records, vecs)
        return [r.id for r in records]

    def query(self, text: str | None = None, *, vector: Any = None, k: int = 5,
              filters: Mapping[str, Any] | None = None, reader: str | None = None) -> list[Hit]:
        """The ``k`` records most similar to ``text`` (or ``vector`` [dim]), best first.

        Args:
            text: Query text, embedded with the bank's embedder.
            vector: Query vector instead of text.
            k: How many hits at most.
            filters: Metadata conditions, see :class:`agentrt.memory.records.Filter`.
            reader: Policy asking; other policies' private records are then never returned.

        Returns:
            Hits with cosine similarity scores, highest first.
        """
        self._check_open()
        if (text is None) == (vector is None):
            raise QueryError("a memory query needs exactly one of text or vector")
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            raise QueryError(f"memory query k must be a positive integer (got {k!r})")
        flt = parse_filter(filters, reader)
        if vector is not None:
            q = self.check_vector(vector)
        elif not isinstance(text, str) or not text.strip():
            raise QueryError("memory query text is empty; pass a non-empty string")
        else:
            q = self._embed([text])[0]
        self._sync()
        return [Hit(rec, score) for rec, score in self.store.search(q, k, flt)]

    def get(self, ids: Iterable[str]) -> list[Record | None]:
        """The records with these ids (None where absent)."""
        self._check_open()
        self._sync()
        return [self.store.get(i) for i in ids]

    def delete(self, ids: Iterable[str] | str) -> int:
        """Deletes records by id; unknown ids are ignored. Returns how many existed."""
        self._check_open()
        ids = [ids] if isinstance(ids, str) else list(ids)
        if not all(isinstance(i, str) for i in ids):
            raise InvalidRecordError("memory record ids to delete must be strings")
        self._sync()
        present = [i for i in dict.fromkeys(ids) if i in self.store]
        if present:
            self._commit_deletes(present)
        return len(present)

    def count(self, filters: Mapping[str, Any] | None = None, reader: str | None = None) -> int:
        """Number of records (passing ``filters`` and visible to ``reader`` when given)."""
        self._check_open()
        flt = parse_filter(filters, reader)
        self._sync()
        return self.store.count(flt)

    def records(self) -> list[Record]:
        """All records, oldest first."""
        self._check_open()
        self._sync()
        return self.store.records()

    def snapshot(self, path: str | Path) -> Path:
        """Writes the whole bank (records, vectors, index) to the folder ``path``, atomically."""
        self._check_open()
        self._sync()
        return write_snapshot(self.store.state(), path, {"bank": self.name,
                                                         "embedder": self.cfg.embedder})

    def restore(self, path: str | Path) -> None:
        """Makes the bank hold exactly the records of snapshot ``path`` (deletes the rest).

        Raises:
            MemoryBankError: the folder is not a snapshot, or of another dimension.
        """
        self._check_open()
        try:
            state, meta = read_snapshot(path)
        except (OSError, ValueError, KeyError) as exc:
            raise MemoryBankError(
                f"{str(path)!r} is not a readable memory snapshot ({exc})"
            ) from None
        if meta["dim"] != self.dim:
            raise DimensionError(
                f"snapshot {str(path)!r} holds {meta['dim']}-d vectors but bank {self.name!r} "
                f"stores {self.dim}-d; restore it into a bank of the same embedder"
            )
        rows = [(i, Record.from_dict(r)) for i, r in enumerate(state["rows"]) if r is not None]
        keep = {rec.id for _, rec in rows}
        self._sync()
        extra = [r.id for r in self.store.records() if r.id not in keep]
        if extra:
            self._commit_deletes(extra)
        missing = [(i, rec) for i, rec in rows if rec.id not in self.store]
        if missing:
            rows_missing = [i for i, _ in missing]
            self._commit_puts([rec for _, rec in missing], state["vectors"][rows_missing])
