"""agentrt.memory: memory banks that policies read and write across episodes.

>>> from agentrt.memory import open_bank
>>> bank = open_bank({"name": "notes"}, run_dir="runs/demo")      # FAISS, in the run folder
>>> bank.write("the door code is 4512", policy_id="alice", env="vault", tags=["fact"])
>>> [h.record.text for h in bank.query("door code", k=3, reader="alice")]

Backends: ``faiss`` (embedded default, persisted in the run folder) and ``redis`` (shared by
workers and nodes). Embedders: ``hashing`` (fast default) and ``minilm`` (all-MiniLM-L6-v2).
See docs/memory.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrt.memory.augment import MemoryConfig, retrieve_context, write_episode_memories
from agentrt.memory.bank import MemoryBank
from agentrt.memory.config import BankConfig, IndexConfig, RedisConfig, bank_config
from agentrt.memory.embedders import (
    EMBEDDERS,
    Embedder,
    HashingEmbedder,
    MiniLMEmbedder,
    build_embedder,
)
from agentrt.memory.errors import (
    BackendUnavailableError,
    DimensionError,
    FilterError,
    InvalidRecordError,
    MemoryBankError,
    QueryError,
)
from agentrt.memory.faiss_bank import FaissBank, default_path
from agentrt.memory.records import FILTER_FIELDS, Hit, Record


def open_bank(cfg: BankConfig | dict[str, Any], run_dir: str | Path | None = None,
              embedder: Embedder | None = None) -> MemoryBank:
    """Opens (or creates) the bank described by ``cfg``.

    Args:
        cfg: A :class:`BankConfig` or a dict of its fields.
        run_dir: Run folder; a FAISS bank without ``path`` lives in ``<run_dir>/memory/<name>``
            (None and no path: in memory only).
        embedder: Optional embedder instance to share between banks.

    Raises:
        MemoryBankError: invalid config, or (redis) a server that does not answer.
    """
    cfg = bank_config(cfg)
    if cfg.backend == "redis":
        from agentrt.memory.redis_bank import RedisBank

        return RedisBank(cfg, embedder)
    return FaissBank(cfg, default_path(cfg, run_dir), embedder)


__all__ = [
    "EMBEDDERS", "FILTER_FIELDS", "BackendUnavailableError", "BankConfig", "DimensionError",
    "Embedder", "FaissBank", "FilterError", "HashingEmbedder", "Hit", "IndexConfig",
    "InvalidRecordError", "MemoryBank", "MemoryBankError", "MemoryConfig", "MiniLMEmbedder",
    "QueryError", "Record", "RedisConfig", "bank_config", "build_embedder", "open_bank",
    "retrieve_context", "write_episode_memories",
]
