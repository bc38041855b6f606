"""Validated config of a memory bank (frozen pydantic; unknown keys are rejected).

Example YAML::

    memory:
      banks:
        notes: {backend: faiss, embedder: hashing, index: {kind: auto}}
        league: {backend: redis, redis: {url: "redis://10.0.0.5:6379/0", password_env: REDIS_PW}}

Secrets never reach a file: a saved config (``model_dump(mode="json")``: the run folder's
``config.yaml``, reports) shows the URL's password as ``***`` and ``password`` as ``**********``,
while the config in memory keeps both. ``password_env`` names an environment variable instead, so
a saved config still connects when it is read back.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import (Field, SecretStr, ValidationError, field_serializer,
                      model_validator)

from agentrt.memory.errors import MemoryBankError
from agentrt.core.schema import ConfigModel
from agentrt.core.urls import redact


class _Section(ConfigModel):
    """A section of the memory config."""


class IndexConfig(_Section):
    kind: Literal["auto", "flat", "hnsw", "ivf"] = Field(
        "auto", description="FAISS index: exact flat, HNSW graph, IVF lists, or auto by size."
    )
    auto_threshold: int = Field(
        50_000, gt=0, description="auto: exact flat up to this many records, HNSW above."
    )
    hnsw_m: int = Field(32, gt=1, description="HNSW: neighbours per node (memory vs recall).")
    hnsw_ef_construction: int = Field(40, gt=0, description="HNSW: beam width while inserting.")
    hnsw_ef_search: int = Field(96, gt=0, description="HNSW: beam width while searching.")
    ivf_nlist: int | None = Field(
        None, gt=0, description="IVF: number of lists (default sqrt(records) at build time)."
    )
    ivf_nprobe: int = Field(16, gt=0, description="IVF: lists visited per query.")
    rebuild_dead_fraction: float = Field(
        0.25, gt=0.0, le=1.0, description="Rebuild the index when this share of rows is deleted."
    )


class RedisConfig(_Section):
    url: str = Field(..., description="redis:// or rediss:// (TLS) URL, e.g. redis://host:6379/0.")
    username: str | None = Field(None, description="ACL user name (overrides the URL's).")
    password: SecretStr | None = Field(None, description="Password (overrides the URL's).")
    password_env: str | None = Field(
        None, min_length=1, description="Environment variable holding the password (overrides "
        "password and the URL's); the way to keep it out of config files.")
    tls: bool = Field(False, description="Use TLS even when the URL says redis://.")
    tls_ca_certs: str | None = Field(None, description="CA bundle that signs the server cert.")
    tls_certfile: str | None = Field(None, description="Client certificate for mutual TLS.")
    tls_keyfile: str | None = Field(None, description="Client key for mutual TLS.")
    tls_verify: bool = Field(True, description="Verify the server certificate.")
    connect_timeout_s: float = Field(2.0, gt=0.0, description="Give up connecting after this.")
    socket_timeout_s: float = Field(5.0, gt=0.0, description="Give up on one reply after this.")
    key_prefix: str = Field("agentrt:memory", min_length=1, description="Prefix of all keys.")
    max_buffer: int = Field(
        1_000_000, gt=0, description="Writes held in memory while Redis is down; more is an error."
    )
    log_retention_s: float = Field(
        86400.0, gt=0.0,
        description="Keep change-log entries this long; a worker idle longer reloads the bank.",
    )
    retry_interval_s: float = Field(
        0.2, gt=0.0, description="How often buffered writes retry while Redis is down."
    )

    @model_validator(mode="after")
    def _scheme(self) -> RedisConfig:
        if not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("url must start with redis://, rediss:// or unix://")
        return self

    @field_serializer("url", when_used="json")
    def _redacted_url(self, url: str) -> str:
        return redact(url)

    def secret(self) -> str | None:
        """The password to send: ``password_env``'s variable, else ``password``, else None (the
        URL's own, if any). Raises MemoryBankError when the variable is not set."""
        if self.password_env is not None:
            if self.password_env not in os.environ:
                raise MemoryBankError(
                    f"memory.redis.password_env names {self.password_env!r}, which is not set in "
                    "the environment; export it with the Redis password")
            return os.environ[self.password_env]
        return self.password.get_secret_value() if self.password is not None else None




class BankConfig(_Section):
    name: str = Field(
        "default", pattern=r"^[A-Za-z0-9_.-]+$", description="Bank name (folder and key name)."
    )
    backend: Literal["faiss", "redis"] = Field(
        "faiss", description="faiss: in-process, persisted in the run folder; redis: shared."
    )
    embedder: str = Field("hashing", description="Embedder name from memory.EMBEDDERS.")
    dim: int | None = Field(
        None, gt=0, description="Embedding size; default: the embedder's (hashing 256, minilm 384)."
    )
    path: str | None = Field(
        None, description="faiss: bank folder (default <run_dir>/memory/<name>)."
    )
    index: IndexConfig = Field(default_factory=IndexConfig)
    redis: RedisConfig | None = Field(None, description="Connection of the redis backend.")
    snapshot_every: int = Field(
        5000, gt=0,
        description="faiss: fold the log into a snapshot once it holds max(N, bank size) records.",
    )
    fsync: bool = Field(False, description="faiss: fsync the log on every write (power-loss safe).")

    @model_validator(mode="after")
    def _checks(self) -> BankConfig:
        from agentrt.memory.embedders import EMBEDDERS

        if self.embedder not in EMBEDDERS:
            raise ValueError(
                f"unknown embedder {self.embedder!r}; valid: {', '.join(EMBEDDERS.names())}"
            )
        if self.backend == "redis" and self.redis is None:
            raise ValueError("backend 'redis' needs a redis section with at least url")
        return self


def bank_config(data: dict | BankConfig | None = None, **fields: object) -> BankConfig:
    """Validates a bank config; a bad value raises :class:`MemoryBankError` in one line."""
    if isinstance(data, BankConfig) and not fields:
        return data
    raw = data.model_dump() if isinstance(data, BankConfig) else dict(data or {})
    raw.update(fields)
    try:
        return BankConfig.model_validate(raw)
    except ValidationError as exc:
        from agentrt.core.schema import format_validation_error

        raise MemoryBankError(
            f"invalid memory bank config: {format_validation_error(exc)}"
        ) from None
