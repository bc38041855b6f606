"""The learned reward model executor: a local Hugging Face sequence classifier scores
``prompt + response`` in batches, on the policy's device.

A 1-label head's logit is the reward (a Bradley-Terry reward model); a 2-label head's reward is
the probability of label 1 ("right"). ``examples/train_reward_model.py`` trains one and uses
:func:`encode` below, so training and scoring see the same tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from agentrt.core.device import module_device
from agentrt.rewards.classifier import classifier_labels
from agentrt.rewards.executors import RewardExecutor, Sample, Scores

if TYPE_CHECKING:
    from agentrt.rewards.sources import ModelSource


def encode(tokenizer: Any, prompts: list[str], responses: list[str], max_length: int,
           device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Token ids of ``prompt + response`` (bos first, the end kept when too long), left-padded
    with the pad token, as ``input_ids`` and ``attention_mask`` [B, T]."""
    rows = []
    for prompt, response in zip(prompts, responses):
        ids = tokenizer.encode(prompt + response, add_special_tokens=False)[-(max_length - 1):]
        rows.append([int(tokenizer.bos_token_id)] + ids if tokenizer.bos_token_id is not None
                    else ids)
    width = max(len(r) for r in rows)
    pad = int(tokenizer.pad_token_id)
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    return {"input_ids": input_ids, "attention_mask": mask}


def load_classifier(folder: str, device: str | torch.device = "cpu") -> tuple[Any, Any]:
    """(model in eval mode on ``device``, tokenizer with a pad token) of a classifier folder."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(folder).to(device).eval()
    model.config.pad_token_id = tokenizer.pad_token_id  # the classifier pools the last real token
    return model, tokenizer


def rewards_of(logits: torch.Tensor) -> torch.Tensor:
    """[B] rewards from [B, 1] (the logit) or [B, 2] logits (probability of label 1)."""
    if logits.shape[-1] == 1:
        return logits[:, 0].float()
    return torch.softmax(logits.float(), dim=-1)[:, 1]


class ModelExecutor(RewardExecutor):
    """Scores ``batch_size`` samples per forward pass, without gradients."""

    def __init__(self, src: ModelSource, device: str = "cpu") -> None:
        super().__init__(src.metric_name)
        classifier_labels(src.model, "reward model")
        self.src, self.device = src, torch.device(device)
        self.model, self.tokenizer = load_classifier(src.model, self.device)

    @torch.no_grad()
    def _score(self, samples: list[Sample]) -> Scores:
        values: list[float] = []
        n = self.src.batch_size
        for i in range(0, len(samples), n):
            part = samples[i:i + n]
            batch = encode(self.tokenizer, [s.prompt for s in part], [s.response for s in part],
                           self.src.max_length, module_device(self.model))
            values += rewards_of(self.model(**batch).logits).tolist()
        return values, [None] * len(values), {}

    def close(self) -> None:
        self.model = None
