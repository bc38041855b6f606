"""Errors a memory-bank user can meet: one sentence saying what is wrong and how to fix it."""

from __future__ import annotations

from agentrt.core.errors import AgentrtError


class MemoryBankError(AgentrtError):
    """Base class of memory-bank errors, raised before any state changes (the bank stays intact)."""


class InvalidRecordError(MemoryBankError):
    """A record to write is malformed (empty text, bad visibility, duplicate id, ...)."""


class DimensionError(MemoryBankError):
    """A vector's length does not match the bank's embedding dimension, or it is not finite."""


class FilterError(MemoryBankError):
    """A query filter names an unknown field or gives a value of the wrong type."""


class BackendUnavailableError(MemoryBankError):
    """The storage backend (a Redis server) did not answer or refused the connection."""


class QueryError(MemoryBankError):
    """A query is malformed (no text or vector, empty text, k not positive)."""
