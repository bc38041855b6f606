"""Rollout backends beyond HF generate: the vLLM engine and its LoRA adapter registry.

Importing this package does not import vLLM; the engine imports it when it starts.
"""

from agentrt.runtime.rollout.adapters import Adapter, AdapterRegistry, write_adapter
from agentrt.runtime.rollout.vllm_backend import RolloutStartError, VLLMRollout

__all__ = ["Adapter", "AdapterRegistry", "RolloutStartError", "VLLMRollout", "write_adapter"]
