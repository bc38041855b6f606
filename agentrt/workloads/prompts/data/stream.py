"""Rows of a file as a shuffled, resumable stream in bounded memory.

An epoch reads the file's blocks (:mod:`agentrt.workloads.prompts.data.readers`) in an order shuffled by (seed,
epoch) and pours their rows through a buffer of ``shuffle_buffer`` rows; each row out is drawn at
random from the buffer. Every usable row comes out exactly once per epoch. The state is small
and exact: epoch, the position in the block order, the rows read of the current block, the rows
out this epoch and the buffer's rows themselves, so a resume continues with the very row the
checkpointed run would have drawn next, reading at most one block to get there.
"""

from __future__ import annotations

import json
import logging
import random
import zlib
from collections import Counter
from typing import Any, Callable, Iterator

from agentrt.workloads.prompts.data.config import Columns
from agentrt.workloads.prompts.data.readers import BLANK, BlockReader

log = logging.getLogger(__name__)

Row = dict[str, Any]  # {"prompt": str} or {"messages": [...]}, "answer": str | None, "info": {}
_PLAIN = (str, int, float, bool)


def map_row(raw: Any, cols: Columns) -> Row | str:
    """The example of a raw row under the column mapping, or why it is skipped ("missing value
    in column 'x'", "wrong type in column 'x'", "not an object")."""
    if not isinstance(raw, dict):
        return "not a JSON object" if raw is None else "not an object"
    name = cols.prompt_column
    value = raw.get(name)
    if value is None:
        return f"missing value in column {name!r}"
    if cols.messages is not None:
        if not _is_messages(value):
            return f"wrong type in column {name!r} (want a list of {{role, content}})"
        row: Row = {"messages": [{"role": m["role"], "content": m["content"]} for m in value]}
    elif isinstance(value, str) and value.strip():
        row = {"prompt": value}
    else:
        return f"wrong type in column {name!r} (want non-empty text)"
    info: dict[str, Any] = {}
    if cols.answer is not None:
        answer = raw.get(cols.answer)
        if answer is None:
            return f"missing value in column {cols.answer!r}"
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            return f"wrong type in column {cols.answer!r} (want text or a number)"
        info["answer"] = str(answer)
    for column in cols.extra:
        value = raw.get(column)
        if value is None:
            return f"missing value in column {column!r}"
        if not _is_plain(value):
            return f"wrong type in column {column!r} (want text, numbers, lists or mappings)"
        info.setdefault(column, value)
    row["answer"] = info.get("answer")
    row["info"] = info
    return row


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str) for m in value)


def _is_plain(value: Any) -> bool:
    """JSON-like data only (what a checkpoint holds and a reward may read)."""
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, list):
        return all(v is None or _is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and (v is None or _is_plain(v)) for k, v in value.items())
    return False


def row_key(row: Row) -> str:
    """The prompt as text: what the held-out split keys on."""
    if "messages" in row:
        return json.dumps(row["messages"], sort_keys=True)
    return row["prompt"]


def hashed_out(key: str, fraction: float) -> bool:
    """True for about ``fraction`` of keys, the same ones every time (crc32 of the key)."""
    return zlib.crc32(key.encode()) % 10_000 < fraction * 10_000


class SkipCounter:
    """Rows skipped, by reason; the first one is a warning line (when ``warn``), the rest are
    counted."""

    def __init__(self, where: str, warn: bool = True) -> None:
        self.where, self.warn = where, warn
        self.reasons: Counter[str] = Counter()

    def __call__(self, reason: str) -> None:
        if self.warn and not self.reasons:
            log.warning("%s: skipped a row (%s); rows skipped are counted in the "
                        "data/skipped_rows metric", self.where, reason)
        self.reasons[reason] += 1

    @property
    def total(self) -> int:
        return sum(self.reasons.values())


def scan(reader: BlockReader, cols: Columns, skip: Callable[[str], None]) -> Iterator[Row]:
    """Every usable row of the file in file order (blocks 0, 1, ...)."""
    for block in range(reader.num_blocks):
        for raw in reader.rows(block):
            if raw is BLANK:
                continue
            row = map_row(raw, cols)
            if isinstance(row, str):
                skip(row)
            else:
                yield row


class ShuffledRows:
    """An endless, epoch-wise shuffled stream of a file's usable rows.

    Args:
        reader: The file's blocks.
        cols: The column mapping.
        seed: Seeds the block order and the draws from the buffer.
        buffer: Rows held for shuffling; 0 reads in file order.
        held_out: Rows for which it is True are never drawn (the eval split).
        where: Names the file in the one warning about skipped rows.
        warn: False: no warning (another stream of the same file gives it).
    """

    def __init__(self, reader: BlockReader, cols: Columns, seed: int, buffer: int,
                 held_out: Callable[[Row], bool], where: str, warn: bool = True) -> None:
        self.reader, self.cols, self.seed, self.size = reader, cols, seed, buffer
        self.held_out = held_out
        self.skipped = SkipCounter(where, warn)
        self.epoch = self.block = self.row = self.out = self.read = 0
        self.buffer: list[Row] = []
        self._rows: Iterator[Any] | None = None
        self._order = self._block_order()

    def _block_order(self) -> list[int]:
        order = list(range(self.reader.num_blocks))
        if self.size:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def _fill(self) -> None:
        """Reads rows until the buffer is full or the epoch's blocks are done."""
        want = max(1, self.size)
        while len(self.buffer) < want and self.block < len(self._order):
            if self._rows is None:
                self._rows = self.reader.rows(self._order[self.block], self.row)
            raw = next(self._rows, _END)
            if raw is _END:
                self.block, self.row, self._rows = self.block + 1, 0, None
                continue
            self.row += 1
            if raw is BLANK:
                continue
            self.read += 1
            row = map_row(raw, self.cols)
            if isinstance(row, str):
                self.skipped(row)
            elif not self.held_out(row):
                self.buffer.append(row)

    def next(self) -> Row:
        """The next row. Raises LookupError when a whole epoch holds no usable row."""
        self._fill()
        if not self.buffer:
            if self.out == 0:
                raise LookupError("no usable training row")
            self.epoch, self.block, self.row, self.out = self.epoch + 1, 0, 0, 0
            self._rows, self._order = None, self._block_order()
            return self.next()
        pick = 0
        if self.size:
            draw = random.Random((self.seed * 1_000_003 + self.epoch) * 1_000_000_007 + self.out)
            pick = draw.randrange(len(self.buffer))
        self.buffer[pick], self.buffer[-1] = self.buffer[-1], self.buffer[pick]
        self.out += 1
        return self.buffer.pop()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "block": self.block, "row": self.row, "out": self.out,
                "read": self.read, "skipped": dict(self.skipped.reasons),
                "buffer": list(self.buffer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.block, self.row = state["epoch"], state["block"], state["row"]
        self.out, self.read = state["out"], state["read"]
        self.skipped.reasons = Counter(state["skipped"])
        self.buffer = list(state["buffer"])
        self._rows, self._order = None, self._block_order()


_END = object()
