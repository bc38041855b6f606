"""A :class:`~agentrt.runtime.learner.HybridEngine`'s saved state: the weights training changes, its
checkpoint (optimizer, schedule, controllers, random streams) and its Hugging Face export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class EngineState:
    """Checkpoint and export methods of HybridEngine (a mixin over its attributes)."""

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The weights that training changes (adapter only for LoRA policies)."""
        return self.shared.weights(self.policy_id)

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        """New weights for this policy (a resume, a league reset), pushed into the rollout."""
        self.shared.load_weights(self.policy_id, state)
        self.sync_rollout()

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.trainable_state(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "critic_optimizer": (self.critic_optimizer.state_dict()
                                 if self.critic_optimizer is not None else None),
            "kl_ctl": self.kl_ctl.state_dict(),
            "version": self.version,
            "shuffle_gen": self.shuffle_gen.get_state(),
            "skipped_steps": self.skipped_steps,
            "rae_state": self.rae_state.state_dict(),
            # A reference re-based on the warm-started weights cannot be rebuilt from the model
            # folder, so it travels with the checkpoint (None: it is the folder's weights).
            "reference": (self.shared.weights(self.reference)
                          if self.reference is not None and self.ref_is_warm_start else None),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.kl_ctl.load_state_dict(state["kl_ctl"])
        self.version = int(state["version"])
        self.shuffle_gen.set_state(state["shuffle_gen"])
        self.skipped_steps = int(state["skipped_steps"])
        self.rae_state.load_state_dict(state["rae_state"])
        if state.get("reference") is not None:
            self.reset_reference()
            self.shared.load_weights(str(self.reference), state["reference"])
        self.load_trainable_state(state["model"])  # last: syncs the rollout at this version

    def save_pretrained(self, folder: str | Path) -> Path:
        """Writes the policy in Hugging Face format (the adapter alone for LoRA policies)."""
        folder = Path(folder)
        if self.is_lora:  # peft puts a non-"default" adapter in a subfolder; this one at the root
            from agentrt.runtime.rollout.adapters import peft_config_dict, write_adapter

            config = peft_config_dict(self.model.peft_config[self.policy_id])
            config["base_model_name_or_path"] = str(self.shared.path)
            write_adapter(folder, self.trainable_state(), config)
        else:
            self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        return folder
