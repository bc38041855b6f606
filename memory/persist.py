"""On-disk form of a vector store: a folder written atomically, and an append-only log.

A snapshot folder holds ``meta.json`` (format, dim, index kind), ``records.jsonl`` (one record per
row, ``null`` for deleted rows), ``vectors.npy`` (float32 [rows, dim]) and ``index.faiss`` (the
serialised FAISS index, so a 100k-record HNSW graph is not rebuilt on every start). It is written
into a temporary sibling folder and renamed into place, so a crash never leaves half a snapshot.

The log is JSON lines appended after each write. A crash mid-line leaves a torn last line, which
:func:`read_log` drops (and truncates) instead of failing: every complete line before it is kept.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterator

import numpy as np

FORMAT = 1


def atomic_write_bytes(path: Path, data: bytes, fsync: bool = True) -> None:
    """Writes ``data`` to ``path`` via a temporary file and os.replace (never half a file)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_snapshot(
    state: dict[str, Any], path: str | Path, extra: dict[str, Any] | None = None
) -> Path:
    """Writes a :meth:`VectorStore.state` dict as a snapshot folder at ``path``.

    An existing folder at ``path`` is replaced: the new one is complete on disk before the old
    one is moved aside and removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.mkdir()
    try:
        with open(tmp / "records.jsonl", "w") as fh:
            for row in state["rows"]:
                fh.write(json.dumps(row) + "\n")
        np.save(tmp / "vectors.npy", state["vectors"])
        (tmp / "index.faiss").write_bytes(np.asarray(state["index"]).tobytes())
        meta = {"format": FORMAT, "dim": int(state["vectors"].shape[1]), "kind": state["kind"],
                "trained_at": state["trained_at"], **(extra or {})}
        (tmp / "meta.json").write_text(json.dumps(meta))
        for name in ("records.jsonl", "vectors.npy", "index.faiss", "meta.json"):
            with open(tmp / name, "rb") as fh:
                os.fsync(fh.fileno())
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.old")
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def read_snapshot(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reads a snapshot folder; returns ``(state, meta)`` for :meth:`VectorStore.load_state`."""
    path = Path(path)
    meta = json.loads((path / "meta.json").read_text())
    rows = [json.loads(line) for line in (path / "records.jsonl").read_text().splitlines()]
    vectors = np.load(path / "vectors.npy")
    index = np.frombuffer((path / "index.faiss").read_bytes(), dtype=np.uint8)
    state = {"rows": rows, "vectors": vectors, "index": index, "kind": meta["kind"],
             "trained_at": meta.get("trained_at", 0)}
    return state, meta


def encode_vectors(vecs: np.ndarray) -> str:
    """float32 [n, d] -> base64 text (exact, 4 bytes per value)."""
    return base64.b64encode(np.ascontiguousarray(vecs, dtype=np.float32).tobytes()).decode()


def decode_vectors(text: str, dim: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=np.float32).reshape(-1, dim).copy()


def read_log(path: Path) -> Iterator[dict[str, Any]]:
    """Yields the complete entries of a log file; a torn last line is cut off the file."""
    if not path.exists():
        return
    good_end = 0
    with open(path, "rb") as fh:
        data = fh.read()
    entries = []
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            break
        good_end += len(line)
    if good_end != len(data):
        with open(path, "r+b") as fh:
            fh.truncate(good_end)
    yield from entries
