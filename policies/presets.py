"""Named sizes of the small local models (see :func:`agentrt.policies.models.build_model`).

Kept apart from ``models`` (torch, transformers) so that a config naming a preset is checked
without loading either. A preset is ``<architecture>-<size>``: ``llama-tiny``, ``qwen2-tiny``,
``gemma2-small``... Every architecture at one size has the same width, depth and heads, so their
figures compare like for like.
"""

from __future__ import annotations

# size -> widths (head_dim = hidden_size / num_attention_heads = 64 throughout: vLLM's CPU
# attention rejects smaller heads).
SIZES: dict[str, dict[str, int]] = {
    "nano": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=1, num_key_value_heads=1),
    "tiny": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=2),
    "small": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=4),
    "base": dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
                 num_attention_heads=8, num_key_value_heads=8),
}

# Positions every preset model takes (prompt + response).
CONTEXT = 2048

# The architectures a preset can name: transformers' model_type of each.
ARCHITECTURES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3",
                                  "phi3", "gpt2", "gpt_neox")

# name -> (architecture, widths)
PRESETS: dict[str, tuple[str, dict[str, int]]] = {
    f"{arch}-{size}": (arch, widths) for arch in ARCHITECTURES for size, widths in SIZES.items()
}
