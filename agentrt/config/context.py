"""What a policy's model allows: the longest sequence it takes, and a rollout's
``max_new_tokens`` checked against it (before any work, and again when a live change sets it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrt.core.errors import ConfigError
from agentrt.policies.presets import CONTEXT

_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def model_context(model: Any) -> int | None:
    """The longest sequence (prompt + response) the policy's model takes: its config's
    ``max_position_embeddings`` (or its family's name for it), None where unknown (an adapter
    folder, a config without one)."""
    if model.preset is not None:
        return CONTEXT
    try:
        found = json.loads((Path(model.path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict):
        return None
    for cfg in (found, found.get("text_config") or {}):
        for key in _CONTEXT_KEYS:
            if isinstance(cfg.get(key), int) and cfg[key] > 0:
                return int(cfg[key])
    return None


def check_context(field: str, policy: Any) -> None:
    """``rollout.sampling.max_new_tokens`` must leave room for a prompt in the model's context
    (a longer one would end every rollout at once and train nothing)."""
    context = model_context(policy.model)
    wanted = policy.rollout.sampling.max_new_tokens
    if context is not None and wanted >= context:
        raise ConfigError(f"{field}.rollout.sampling.max_new_tokens: {wanted} leaves no room "
                          f"for a prompt in the model's context of {context} tokens; give at "
                          f"most {context - 1} minus the longest prompt")


def check_contexts(cfg: Any) -> None:
    """:func:`check_context` of every policy of a run config (``policy`` or ``policies``)."""
    if hasattr(cfg, "policy"):
        check_context("policy", cfg.policy)
    for i, policy in enumerate(getattr(cfg, "policies", ())):
        check_context(f"policies.{i}", policy)
