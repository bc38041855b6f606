"""Policies: LM policies over Hugging Face models and the factory for small local models."""

from agentrt.core.lazy import lazy_exports

# Loaded on first use: the scripted policies and presets import without torch or transformers.
__getattr__, __dir__, __all__ = lazy_exports(__name__, globals(), {
    "agentrt.policies.base": ("Action", "ActRequest", "CallablePolicy", "Policy", "as_policy"),
    "agentrt.policies.lm": ("LMPolicy", "PromptTemplate", "bank_memory"),
    "agentrt.policies.models": ("build_model", "build_tokenizer", "load_model", "model_config"),
    "agentrt.policies.presets": ("PRESETS",),
    "agentrt.policies.scripted": ("BargainHeuristic", "CalculatorAgent", "ConnectFourHeuristic",
                                  "KuhnPolicy", "MinimaxTicTacToe", "RandomPolicy", "kuhn_nash"),
})
