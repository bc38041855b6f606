"""Shared fixtures. Tests are CPU-first; models are built locally (nothing is downloaded)."""

from __future__ import annotations

import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A llama-tiny model + byte tokenizer in HF format, built once per session."""
    from agentrt.policies import build_model

    return build_model(tmp_path_factory.mktemp("models") / "llama-tiny", "llama-tiny", seed=0)
