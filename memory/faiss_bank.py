"""The embedded backend: a FAISS index in this process, persisted in the run folder.

Folder layout (``<run_dir>/memory/<bank>/`` by default)::

    CURRENT              name of the live snapshot folder, replaced atomically
    snap-000000004000/   snapshot after write number 4000 (see persist.py)
    wal-000000004000.jsonl  every write after that snapshot, one JSON line each

A write is appended to the log (and flushed to the OS) before it is applied in memory, so after a
crash the bank reopens with every acknowledged write. Once the log holds as many records as the
bank (and at least ``snapshot_every``), it is folded into a new snapshot: the snapshot is
complete on disk before CURRENT points at it, and the old snapshot and log are deleted only after
that, so a crash at any moment leaves a readable bank.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from pathlib import Path

import numpy as np

from agentrt.memory.bank import MemoryBank
from agentrt.memory.config import BankConfig
from agentrt.memory.embedders import Embedder
from agentrt.memory.errors import DimensionError, InvalidRecordError, MemoryBankError
from agentrt.memory.persist import (
    atomic_write_bytes,
    decode_vectors,
    encode_vectors,
    read_log,
    read_snapshot,
    write_snapshot,
)
from agentrt.memory.records import Record


# Every name a bank writes in its folder: snapshots, logs, and persist.py's temporary files
# (".<name>.<8 hex>.tmp", and ".<snapshot>.<8 hex>.old" of a replaced snapshot).
_WRITTEN = re.compile(r"snap-\d{12}|wal-\d{12}\.jsonl|"
                      r"\.(?:snap-\d{12}|CURRENT|bank\.json)\.[0-9a-f]{8}\.tmp|"
                      r"\.snap-\d{12}\.[0-9a-f]{8}\.old")


class FaissBank(MemoryBank):
    """A memory bank kept in this process and persisted in ``path``.

    Thread-safe: concurrent writers in one process are serialised on the log; readers see every
    write that returned.

    Args:
        cfg: Bank config (``backend: faiss``).
        path: Bank folder; None keeps the bank in memory only (tests, throwaway banks).
        embedder: Optional shared embedder.
    """

    def __init__(self, cfg: BankConfig, path: str | Path | None = None,
                 embedder: Embedder | None = None) -> None:
        super().__init__(cfg, embedder)
        self.path = None if path is None else Path(path)
        self._write_lock = threading.RLock()
        self._seq = 0  # number of log entries ever applied (snapshot seq + log lines)
        self._since_snapshot = 0
        self._log = None
        if self.path is not None:
            self._open_folder()

    # ---- folder ------------------------------------------------------------------------------
    def _open_folder(self) -> None:
        assert self.path is not None
        if self.path.is_dir() and not (self.path / "bank.json").exists() and any(
                self.path.iterdir()):
            raise MemoryBankError(
                f"memory bank {self.name!r}: {str(self.path)!r} holds other files and no "
                "bank.json, so it is not a bank folder; give a new or empty folder as its path")
        self.path.mkdir(parents=True, exist_ok=True)
        self._check_identity()
        current = self.path / "CURRENT"
        base_seq = 0
        if current.exists():
            state, meta = read_snapshot(self.path / current.read_text().strip())
            self.store.load_state(state)
            base_seq = int(meta["seq"])
        self._seq = base_seq
        log_path = self._log_path(base_seq)
        for entry in read_log(log_path):
            self._apply(entry)
            self._seq += 1
            self._since_snapshot += _size(entry)
        self._remove_stale(keep_seq=base_seq)
        self._log = open(log_path, "a", encoding="utf-8")

    def _check_identity(self) -> None:
        """Refuses to open a folder written with another dimension (before reading any vector)."""
        ident = self.path / "bank.json"  # type: ignore[operator]
        if not ident.exists():
            atomic_write_bytes(ident, json.dumps({"dim": self.dim, "embedder": self.cfg.embedder,
                                                  "name": self.name}).encode())
            return
        dim = json.loads(ident.read_text())["dim"]
        if dim != self.dim:
            raise DimensionError(
                f"bank folder {str(self.path)!r} holds {dim}-d vectors but the bank is "
                f"configured for {self.dim}-d; use the same embedder and dim"
            )

    def _log_path(self, seq: int) -> Path:
        return self.path / f"wal-{seq:012d}.jsonl"  # type: ignore[operator]

    def _remove_stale(self, keep_seq: int) -> None:
        """Deletes snapshots, logs and temporary files other than the live ones (left by a crash
        mid-rotation): only names this bank writes (:data:`_WRITTEN`), never anything else."""
        keep = {f"snap-{keep_seq:012d}", self._log_path(keep_seq).name, "CURRENT", "bank.json"}
        for entry in self.path.iterdir():  # type: ignore[union-attr]
            if entry.name not in keep and _WRITTEN.fullmatch(entry.name):
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)

    def _apply(self, entry: dict) -> None:
        if entry["op"] == "put":
            records = [Record.from_dict(r) for r in entry["records"]]
            self.store.add(records, decode_vectors(entry["vectors"], self.dim))
        elif entry["op"] == "del":
            self.store.remove(entry["ids"])

    def _append(self, entry: dict) -> None:
        """Logs one entry durably, applies it, and folds the log into a snapshot when due."""
        with self._write_lock:
            self._check_open()
            if self._log is not None:
                self._log.write(json.dumps(entry) + "\n")
                self._log.flush()
                if self.cfg.fsync:
                    os.fsync(self._log.fileno())
            self._apply(entry)
            self._seq += 1
            self._since_snapshot += _size(entry)
            # Fold when the log holds as many records as the bank (and at least snapshot_every):
            # snapshots then cost O(1) amortised per write, and replay stays shorter than a load.
            due = max(self.cfg.snapshot_every, len(self.store))
            if self._log is not None and self._since_snapshot >= due:
                self.checkpoint()

    def checkpoint(self) -> None:
        """Folds the log into a new snapshot now (also done when the log outgrows the bank)."""
        if self.path is None:
            return
        with self._write_lock:
            name = f"snap-{self._seq:012d}"
            write_snapshot(self.store.state(), self.path / name,
                           {"seq": self._seq, "bank": self.name, "embedder": self.cfg.embedder})
            new_log = open(self._log_path(self._seq), "a", encoding="utf-8")
            # The pointer flips only once the new snapshot is complete on disk.
            atomic_write_bytes(self.path / "CURRENT", name.encode())
            old, self._log = self._log, new_log
            if old is not None:
                old.close()
            self._since_snapshot = 0
            self._remove_stale(keep_seq=self._seq)

    # ---- hooks -------------------------------------------------------------------------------
    def _commit_puts(self, records: list[Record], vecs: np.ndarray) -> None:
        with self._write_lock:
            # Re-check under the lock: another thread may have written the same id meanwhile.
            clash = [r.id for r in records if r.id in self.store]
            if clash:
                raise InvalidRecordError(
                    f"memory record id {clash[0]!r} already exists in bank {self.name!r}"
                )
            self._append({"op": "put", "records": [r.to_dict() for r in records],
                          "vectors": encode_vectors(vecs)})

    def _commit_deletes(self, ids: list[str]) -> None:
        self._append({"op": "del", "ids": ids})

    def close(self) -> None:
        """Closes the log; the bank reopens from its folder with every write."""
        with self._write_lock:
            if self._log is not None:
                self._log.flush()
                os.fsync(self._log.fileno())
                self._log.close()
                self._log = None
            self.closed = True


def _size(entry: dict) -> int:
    """Records a log entry touches."""
    return len(entry["records"]) if entry["op"] == "put" else len(entry["ids"])


def default_path(cfg: BankConfig, run_dir: str | Path | None) -> Path | None:
    """Where a FAISS bank lives: ``cfg.path``, else ``<run_dir>/memory/<name>``, else nowhere."""
    if cfg.path is not None:
        return Path(cfg.path)
    if run_dir is None:
        return None
    return Path(run_dir) / "memory" / cfg.name
