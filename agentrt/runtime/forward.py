"""The forward passes of one learner: micro-batches, the rows each pass computes (trimmed,
packed, a shared prompt computed once), autocast and torch.compile, and the padding they cost.

A :class:`ForwardPasses` belongs to one :class:`~agentrt.runtime.learner.Learner`: its updates
and its no-grad log-prob and value passes all go through it. The layout arithmetic itself is
:mod:`agentrt.runtime.packing`'s.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

import torch
from torch import nn

from agentrt.config.sections import PolicyConfig
from agentrt.core.compiler import require_compiler
from agentrt.core.device import autocast_for
from agentrt.core.types import TrainBatch
from agentrt.runtime.packing import (Forward, Layout, layout, packed_attention, plan_micro_batches,
                                     trained_prefix)
from agentrt.runtime.shared_model import SharedModel
from agentrt.runtime.steps import chunks

log = logging.getLogger(__name__)


class ForwardPasses:
    """Forward passes of policy ``cfg.id`` over the shared model that hosts it.

    Args:
        shared: The model (and the adapters and snapshots on it).
        cfg: The policy's config: micro-batching, packing, compile, the sampling temperature.
    """

    def __init__(self, shared: SharedModel, cfg: PolicyConfig) -> None:
        self.shared = shared
        self.cfg = cfg
        self.policy_id = cfg.id
        self.device = shared.device
        self.pad_id = int(shared.tokenizer.pad_token_id)
        # Positions the forward passes computed, how many were tokens, and the tokens a shared
        # prompt saved (metrics of the next update).
        self.computed_positions, self.computed_tokens, self.shared_tokens = 0, 0, 0
        # policy.packing / share_prefix where the architecture's attention takes them, else
        # padded rows (the same log-probs, more positions computed) and one warning line
        self.packing, self.share_prefix = cfg.packing, cfg.packing and cfg.share_prefix
        if cfg.packing:
            self.packing, self.share_prefix = packed_attention(shared.model, self.device,
                                                               cfg.share_prefix)
            name = type(shared.model).__name__
            if not self.packing:
                log.warning("policy.packing: %s does not confine attention to packed sequences "
                            "(it ignores restarting position ids); training on padded rows "
                            "(set policy.packing: false to say so)", name)
            elif cfg.share_prefix and not self.share_prefix:
                log.warning("policy.share_prefix: %s does not follow a 4D attention mask; "
                            "packing without sharing prompts (set policy.share_prefix: false "
                            "to say so)", name)
        # policy.compile: forward passes with gradients (the update's) call the model through
        # torch.compile, dynamic shapes as every update's packed rows differ; the no-grad
        # log-prob passes (recompute, reference: weights swapped in) and the rollout stay eager.
        if cfg.compile:  # checked at check time; again for a config built in Python
            require_compiler(f"policy {cfg.id!r}: compile")
        self.compiled = torch.compile(shared.model, dynamic=True) if cfg.compile else None

    def reconfigure(self, cfg: PolicyConfig) -> None:
        """A live change of the policy's config (its sampling temperature scales log-probs)."""
        self.cfg = cfg

    @contextlib.contextmanager
    def training(self, dropout: bool) -> Iterator[None]:
        """The model in training mode (dropout on) inside the block only where ``dropout``
        (``algorithm.train_dropout``; SFT always); in eval mode after it. A colocated vLLM
        engine sleeps inside the block (``rollout.vllm.sleep``) and wakes before the sync."""
        if dropout:
            self.shared.train_model.train()
        try:
            with self.shared.rollout_asleep():
                yield
        finally:
            self.shared.train_model.eval()

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast_for(self.device, self.shared.autocast_dtype)

    def micro_batches(self, batch: Any) -> list[list[int]]:
        """Rows of each forward/backward micro-batch: ``micro_batch_size`` rows in batch order,
        or length buckets within ``micro_batch_tokens`` (agentrt.runtime.packing). A preference
        batch is split by examples, never by length."""
        size, budget = self.cfg.micro_batch_size, self.cfg.micro_batch_tokens
        if not isinstance(batch, TrainBatch):
            return [list(range(p.start, p.stop)) for p in chunks(batch.size, size)]
        return plan_micro_batches(batch.attention_mask.sum(-1).tolist(), size, budget,
                                  self.packing, input_ids=batch.input_ids,
                                  prefix=self.shared_prefix(batch) if budget else None)

    def shared_prefix(self, batch: TrainBatch) -> torch.Tensor | None:
        """[B] tokens before each row's first trained token, where rows of one prompt share it
        (``policy.share_prefix`` with packing); None where nothing is shared."""
        if not self.share_prefix:
            return None
        return trained_prefix(batch.loss_mask, batch.attention_mask)

    def layout(self, batch: TrainBatch, share: bool = True) -> Layout:
        """The rows a forward pass of ``batch`` computes: trimmed to its longest row, or packed
        (``policy.packing``), rows of one prompt computing it once (``policy.share_prefix``,
        where ``share``); counted for the padding metrics."""
        prefix = self.shared_prefix(batch) if share else None
        lay = layout(batch.input_ids, batch.attention_mask, self.packing, self.pad_id,
                     prefix, int(getattr(self.shared.model.config, "hidden_size", 0) or 0))
        self.computed_positions += lay.computed
        self.computed_tokens += lay.tokens
        self.shared_tokens += lay.shared
        return lay

    def forward(self, model: nn.Module, batch: TrainBatch, scaled: bool = True) -> Forward:
        """One forward pass of ``batch``: its float logits, divided by the sampling temperature
        when ``scaled`` (so that log-probs match the distribution the rollout sampled from);
        ``.logprobs()`` and ``.entropy()`` read them in the batch's [B, T] rows."""
        lay = self.layout(batch)
        with self.autocast():
            run = self.compiled if self.compiled is not None and torch.is_grad_enabled() and \
                model is self.shared.model else model
            inputs = lay.inputs(self.device)
            if run is self.compiled:
                # the embedding lookup outside the graph: inductor's backward of it scatters the
                # rows' gradients with atomic adds (5.5 ms of llama-small's update at 8.6k
                # positions, 1.0 with torch's own kernel; update 2.5% faster on llama-tiny)
                inputs["inputs_embeds"] = model.get_input_embeddings()(inputs.pop("input_ids"))
            out = run(**inputs)
        temp = (self.cfg.rollout.sampling.temperature or 1.0) if scaled else 1.0
        return Forward(out.logits.float() / temp, lay)

    def critic_values(self, critic: nn.Module, batch: TrainBatch) -> torch.Tensor:
        """[B, T] values of ``batch`` by ``critic`` (aligned like log-probs), with gradients."""
        lay = self.layout(batch, share=False)  # values are read per position, not predicted
        return lay.unpack(critic(**lay.inputs(self.device)))

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch, name: str | None, scaled: bool = True
                 ) -> torch.Tensor:
        """[B, T] log-probs of ``batch.input_ids`` under ``name`` (the policy, a snapshot, or
        None: the model folder's weights), zero off ``loss_mask``; see :meth:`forward`."""
        out = torch.zeros(batch.input_ids.shape)
        for part in self.micro_batches(batch):
            with self.shared.using(name) as model:
                out[part] = self.forward(model, batch.select(part), scaled).logprobs().cpu()
        self.shared.activate(self.policy_id)
        return out * batch.loss_mask

    @torch.no_grad()
    def values(self, critic: nn.Module, batch: TrainBatch) -> torch.Tensor:
        """[B, T] values of ``batch`` by ``critic``, zero off ``loss_mask``."""
        out = torch.zeros(batch.input_ids.shape)
        for part in self.micro_batches(batch):
            out[part] = self.critic_values(critic, batch.select(part)).cpu()
        return out * batch.loss_mask

    def padding_metrics(self) -> dict[str, float]:
        """Padding the forward passes computed since the last call (log-prob passes and the
        update; this process's rows), then starts counting again."""
        padded = self.computed_positions - self.computed_tokens
        out = {"perf/padded_tokens": float(padded),
               "perf/pad_fraction": padded / max(1, self.computed_positions),
               "perf/shared_tokens": float(self.shared_tokens)}
        self.computed_positions, self.computed_tokens, self.shared_tokens = 0, 0, 0
        return out
