"""Named sizes of the small local model (see :func:`agentrt.policies.models.build_model`).

Kept apart from ``models`` (torch, transformers) so that a config naming a preset is checked
without loading either.
"""

from __future__ import annotations

# name -> LlamaConfig overrides (head_dim = hidden_size / num_attention_heads = 64 throughout).
PRESETS: dict[str, dict[str, int]] = {
    "llama-nano": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=1, num_key_value_heads=1),
    "llama-tiny": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=2),
    "llama-small": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=4),
    "llama-base": dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
                       num_attention_heads=8, num_key_value_heads=8),
}
