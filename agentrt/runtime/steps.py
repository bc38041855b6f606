"""The pieces of a learner step that the engine, the pools and the workers share: token
alignment of log-probs and entropy, micro-batch slices, which metrics add up over shares, the
data-parallel hooks, and advantages computed once on a whole batch."""

from __future__ import annotations

from typing import Any, Iterator, Protocol

import torch
from torch import nn

from agentrt.algos import (
    ADVANTAGES,
    KL_ESTIMATORS,
    AdvantageInputs,
    RAEState,
    entropy_from_logits,
    use_rae_state,
)
from agentrt.runtime.rollout.hf import token_logprobs
from agentrt.core.types import TrainBatch


def shift_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Per-token log-probs aligned with ``input_ids`` (position 0 gets 0). [B,T,V] -> [B,T]."""
    lp = token_logprobs(logits[:, :-1], input_ids[:, 1:])
    return torch.nn.functional.pad(lp, (1, 0))


def shift_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the distribution each token was drawn from, aligned like :func:`shift_logprobs`
    (position t: the softmax of logits t-1; position 0 gets 0). [B,T,V] -> [B,T]."""
    return torch.nn.functional.pad(entropy_from_logits(logits[:, :-1]), (1, 0))


# Metrics that are a micro-batch's (or replica's) *share* of a whole mini-batch quantity (losses
# divided by the mini-batch's counts): they add up. Every other metric is a local mean, averaged.
SHARE_METRICS = ("actor/pg_loss", "actor/entropy", "actor/kl", "critic/vf_loss",
                 "rollout/logprob_diff")


def is_share_metric(key: str) -> bool:
    return key in SHARE_METRICS or key.endswith("/loss")


class DataParallel(Protocol):
    """Hooks a data-parallel pool worker plugs into the engine (``agentrt.runtime.worker``).

    Every replica runs ``update`` on the *whole* batch with the same shuffling, trains on its share
    of each mini-batch's rows, divides its losses by the whole mini-batch's token/sequence counts,
    and sums gradients over replicas before clipping, so all replicas take the full-batch step.
    """

    def local_rows(self, n: int) -> slice:
        """This replica's rows of an ``n``-row mini-batch."""

    def sync_grads(self, params: list[nn.Parameter], finite: bool) -> bool:
        """Sums gradients over replicas in place; returns whether every replica was finite."""

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """One value per metric for the whole batch (sums of loss shares, means otherwise)."""


def advantages_from(batch: TrainBatch, algo: Any, kl_coef: float, rae_state: RAEState
                    ) -> dict[str, float]:
    """Fills ``batch.advantages`` and ``batch.returns`` with ``algo``'s estimator.

    A function (not only a method) so that a pool's driver can run it once on the whole batch
    gathered from its workers; ``HybridEngine.compute_advantages`` calls it with its own state.
    """
    rewards = batch.token_rewards
    metrics: dict[str, float] = {}
    if algo.kl.coef > 0.0 and algo.kl.placement == "reward":
        kl = KL_ESTIMATORS.get(algo.kl.estimator)(batch.old_logprobs, batch.ref_logprobs)
        rewards = rewards - kl_coef * kl * batch.loss_mask
        metrics["actor/reward_kl_penalty"] = float((kl * batch.loss_mask).sum() / batch.size)
    inputs = AdvantageInputs(token_rewards=rewards, loss_mask=batch.loss_mask,
                             group_ids=batch.group_ids, values=batch.values)
    with use_rae_state(rae_state):
        batch.advantages, batch.returns = ADVANTAGES.get(algo.advantage)(inputs, algo)
    return metrics


def chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))
