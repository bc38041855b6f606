"""Policies: LM policies over Hugging Face models and the factory for small local models."""

from agentrt.policies.base import Action, ActRequest, CallablePolicy, Policy, as_policy
from agentrt.policies.lm import LMPolicy, PromptTemplate, bank_memory
from agentrt.policies.models import PRESETS, build_model, build_tokenizer, load_model, model_config
from agentrt.policies.scripted import (
    BargainHeuristic,
    CalculatorAgent,
    ConnectFourHeuristic,
    KuhnPolicy,
    MinimaxTicTacToe,
    RandomPolicy,
    kuhn_nash,
)

__all__ = [
    "PRESETS", "build_model", "build_tokenizer", "load_model", "model_config",
    "ActRequest", "Action", "BargainHeuristic", "CalculatorAgent", "CallablePolicy",
    "ConnectFourHeuristic", "KuhnPolicy", "LMPolicy", "MinimaxTicTacToe", "Policy",
    "PromptTemplate", "RandomPolicy", "as_policy", "bank_memory", "kuhn_nash",
]
