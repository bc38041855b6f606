"""Errors a user can meet. The CLI prints their message as one line, never a traceback."""

from __future__ import annotations


class AgentrtError(Exception):
    """Base class of user-facing errors: the message says what is wrong and how to fix it."""


class ConfigError(AgentrtError):
    """The configuration is invalid; raised before any work starts."""


class ModelLoadError(AgentrtError):
    """A model or tokenizer folder is missing or unreadable."""
