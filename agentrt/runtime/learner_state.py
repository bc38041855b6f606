"""What a :class:`~agentrt.runtime.learner.Learner` writes out besides its checkpoint: a policy
in Hugging Face format (the adapter alone for LoRA policies)."""

from __future__ import annotations

from pathlib import Path

from agentrt.runtime.shared_model import SharedModel


def save_pretrained(shared: SharedModel, policy_id: str, folder: str | Path) -> Path:
    """Writes policy ``policy_id`` of ``shared`` into ``folder`` in Hugging Face format: the
    model and tokenizer, or for a LoRA policy its adapter alone (naming the base's folder)."""
    folder = Path(folder)
    if shared.is_lora:  # peft puts a non-"default" adapter in a subfolder; this one at the root
        from agentrt.runtime.rollout.adapters import peft_config_dict, write_adapter

        config = peft_config_dict(shared.model.peft_config[policy_id])
        config["base_model_name_or_path"] = str(shared.path)
        write_adapter(folder, shared.weights(policy_id), config)
    else:
        shared.model.save_pretrained(folder)
    shared.tokenizer.save_pretrained(folder)
    return folder
