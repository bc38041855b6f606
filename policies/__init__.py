"""Policies: LM policies over Hugging Face models and the factory for small local models."""

from agentrt.policies.models import PRESETS, build_model, build_tokenizer, load_model, model_config

__all__ = ["PRESETS", "build_model", "build_tokenizer", "load_model", "model_config"]
