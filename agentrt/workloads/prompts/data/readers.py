"""Block readers: a data file as numbered blocks of rows, each readable from any row on.

A block is the unit the shuffled stream (:mod:`agentrt.workloads.prompts.data.stream`) orders at random and the
unit a resume reopens, so no reader ever holds more than one block's rows:

- JSONL: byte ranges of :data:`JSONL_BLOCK_BYTES`; block k holds the lines that start in it.
  A line that is not JSON comes back as None, a blank line as :data:`BLANK`.
- Parquet: the file's row groups, read in batches of the mapped columns only (pyarrow).
- datasets (``save_to_disk`` folders): ranges of :data:`DATASETS_BLOCK_ROWS` rows of the
  memory-mapped Arrow table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Protocol

from agentrt.core.errors import ConfigError

JSONL_BLOCK_BYTES = 1 << 20
DATASETS_BLOCK_ROWS = 4096
BATCH_ROWS = 1024
BLANK = object()  # a blank JSONL line: no row, but a position


class BlockReader(Protocol):
    """A file as ``num_blocks`` blocks of rows."""

    num_blocks: int

    def columns(self) -> list[str] | None:
        """The file's column names (None: a JSONL file, which has no schema)."""

    def rows(self, block: int, start: int = 0) -> Iterator[Any]:
        """Rows of ``block`` from its ``start``-th row on (dicts; None or BLANK for JSONL lines
        that hold none)."""


class JsonlReader:
    """A JSONL file in byte blocks (constant memory: one line at a time)."""

    def __init__(self, path: Path, block_bytes: int | None = None) -> None:
        self.path, self.block_bytes = path, block_bytes or JSONL_BLOCK_BYTES
        self.num_blocks = max(1, -(-path.stat().st_size // self.block_bytes))

    def columns(self) -> list[str] | None:
        return None

    def rows(self, block: int, start: int = 0) -> Iterator[Any]:
        lo, hi = block * self.block_bytes, (block + 1) * self.block_bytes
        with self.path.open("rb") as f:
            if lo > 0:
                f.seek(lo - 1)
                f.readline()  # the rest of a line that started in the block before
            index = 0
            while f.tell() < hi:
                line = f.readline()
                if not line:
                    return
                if index >= start:
                    yield _parse_line(line)
                index += 1

    def head(self, n: int) -> Iterator[Any]:
        """The first ``n`` lines' rows, in file order."""
        with self.path.open("rb") as f:
            for _, line in zip(range(n), f):
                yield _parse_line(line)


def _parse_line(line: bytes) -> Any:
    if not line.strip():
        return BLANK
    try:
        return json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


class ParquetReader:
    """A Parquet file by row group, reading only ``columns``."""

    def __init__(self, path: Path, columns: list[str] | None = None) -> None:
        import pyarrow.parquet as pq

        self.file = pq.ParquetFile(path)
        self.wanted = columns
        self.num_blocks = max(1, self.file.num_row_groups)

    def columns(self) -> list[str] | None:
        return list(self.file.schema_arrow.names)

    def rows(self, block: int, start: int = 0) -> Iterator[Any]:
        if self.file.num_row_groups == 0:
            return
        skip = start
        for batch in self.file.iter_batches(batch_size=BATCH_ROWS, row_groups=[block],
                                            columns=self.wanted):
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            yield from batch.slice(skip).to_pylist()
            skip = 0


class DatasetsReader:
    """A ``datasets`` folder (memory-mapped Arrow) in ranges of rows."""

    def __init__(self, path: Path, split: str | None, columns: list[str] | None = None,
                 block_rows: int | None = None) -> None:
        import datasets

        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            name = split or ("train" if "train" in ds else None)
            if name not in ds:
                raise ConfigError(f"split {name!r} is not in {str(path)!r}; splits: "
                                  f"{', '.join(ds)}")
            ds = ds[name]
        self._names = list(ds.column_names)
        if columns is not None:
            ds = ds.select_columns([c for c in columns if c in self._names])
        self.ds, self.block_rows = ds, block_rows or DATASETS_BLOCK_ROWS
        self.num_blocks = max(1, -(-len(ds) // self.block_rows))

    def columns(self) -> list[str] | None:
        return self._names

    def rows(self, block: int, start: int = 0) -> Iterator[Any]:
        lo = block * self.block_rows
        hi = min(lo + self.block_rows, len(self.ds))
        for at in range(lo + start, hi, BATCH_ROWS):
            part = self.ds[at:min(at + BATCH_ROWS, hi)]  # dict of columns
            names = list(part)
            yield from (dict(zip(names, values)) for values in zip(*part.values()))


def open_reader(path: str, fmt: str, split: str | None = None,
                columns: list[str] | None = None) -> BlockReader:
    """The block reader of ``path`` in format ``fmt`` ('jsonl', 'parquet', 'datasets').

    Raises:
        ConfigError: the file cannot be read in that format (one line naming it).
    """
    p = Path(path)
    try:
        if fmt == "jsonl":
            return JsonlReader(p)
        if fmt == "parquet":
            return ParquetReader(p, columns)
        return DatasetsReader(p, split, columns)
    except ConfigError:
        raise
    except (OSError, ValueError, ImportError) as exc:  # pyarrow's errors derive from these
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{path!r} cannot be read as {fmt} ({first})") from None
