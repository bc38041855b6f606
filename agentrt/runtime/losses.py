"""The loss of one micro-batch, per kind of update: policy (RL), critic, SFT and preference.

Each takes what the learner's forward pass computed (log-probs, entropy or values, [B, T]), the
micro-batch's other tensors and the algorithm's config, and returns ``(loss, metrics)``: the
micro-batch's share of its mini-batch's loss (``n_tok``/``n_seq`` count the mini-batch), which
:func:`agentrt.runtime.steps.optimizer_step` accumulates into one optimizer step.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrt.algos import KL_ESTIMATORS, POLICY_LOSSES, PREFERENCE_LOSSES
from agentrt.algos.config import AlgorithmConfig
from agentrt.algos.losses import aggregate, sft_token_loss, value_token_loss
from agentrt.algos.preference import group_mean, sequence_logps
from agentrt.core.types import TrainBatch


def policy_loss(logp: torch.Tensor, token_entropy: torch.Tensor, mb: TrainBatch,
                algo: AlgorithmConfig, kl_coef: float, n_tok: float, n_seq: float,
                old_from_update: bool = False, rollout_diff: bool = False
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """A micro-batch's share of the policy loss.

    Args:
        logp: [B, T] log-probs of ``mb`` by the policy being trained (with gradients).
        token_entropy: [B, T] entropy of each token's distribution (detached where
            ``algo.entropy_coef`` is 0).
        mb: The micro-batch: old and reference log-probs, advantages, loss mask.
        algo: The policy's algorithm.
        kl_coef: The KL controller's coefficient now (used with ``algo.kl.placement: loss``).
        n_tok, n_seq: Tokens and sequences of the whole mini-batch.
        old_from_update: The old log-probs are ``logp`` itself, detached.
        rollout_diff: Report the gap of ``logp`` to ``mb.old_logprobs`` (the rollout's) as
            rollout/logprob_diff.
    """
    old = logp.detach() if old_from_update else mb.old_logprobs
    token_loss, metrics = POLICY_LOSSES.get(algo.policy_loss)(
        logp, old, mb.advantages, mb.loss_mask, algo)
    if rollout_diff:  # a share of the mini-batch's token mean: micro-batches add up
        gap = (logp.detach() - mb.old_logprobs).abs() * mb.loss_mask
        metrics["rollout/logprob_diff"] = float(gap.sum()) / n_tok
    agg = lambda x: aggregate(x, mb.loss_mask, algo.loss_agg, n_tok, n_seq)  # noqa: E731
    pg_loss = agg(token_loss)
    entropy = agg(token_entropy)
    loss = pg_loss - algo.entropy_coef * entropy
    metrics.update({"actor/pg_loss": float(pg_loss.detach()),
                    "actor/entropy": float(entropy.detach())})
    if algo.kl.coef > 0.0:  # KL to the reference is on (in the loss or the reward)
        kl = agg(KL_ESTIMATORS.get(algo.kl.estimator)(logp, mb.ref_logprobs))
        if algo.kl.placement == "loss":
            loss = loss + kl_coef * kl
        metrics["actor/kl"] = float(kl.detach())
    return loss, metrics


def critic_loss(values: torch.Tensor, mb: TrainBatch, algo: AlgorithmConfig, n_tok: float,
                n_seq: float) -> tuple[torch.Tensor, dict[str, float]]:
    """A micro-batch's share of the value loss (scaled by ``vf_coef``) of the critic's [B, T]
    ``values`` (with gradients) against ``mb``'s old values and returns."""
    token_loss, metrics = value_token_loss(values, mb.values, mb.returns, mb.loss_mask,
                                           algo.value_clip)
    loss = aggregate(token_loss, mb.loss_mask, algo.loss_agg, n_tok, n_seq)
    metrics["critic/vf_loss"] = float(loss.detach())
    return algo.vf_coef * loss, metrics


def sft_loss(logp: torch.Tensor, loss_mask: torch.Tensor, n_tok: float, n_seq: float
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """A micro-batch's share of the token-mean cross-entropy on ``loss_mask`` tokens, from the
    model's (unscaled) [B, T] log-probs."""
    return aggregate(sft_token_loss(logp, loss_mask), loss_mask, "token-mean", n_tok,
                     n_seq), {}


def preference_loss(logp: torch.Tensor, mb: Any, algo: AlgorithmConfig, n_seq: float
                    ) -> tuple[torch.Tensor, dict[str, float]]:
    """A micro-batch's share of the mean per-example preference loss of its mini-batch.

    Args:
        logp: [N, T] log-probs of the micro-batch's responses ``mb.seqs`` by the model
            (unscaled, with gradients).
        mb: A :class:`~agentrt.runtime.preference.PreferenceBatch` (reference log-probs, index).
        algo: The policy's algorithm.
        n_seq: Examples of the whole mini-batch.
    """
    policy = sequence_logps(logp, mb.seqs.loss_mask.to(logp.device)).cpu()
    per_example, metrics = PREFERENCE_LOSSES.get(str(algo.preference_loss))(
        policy, mb.ref_logps, mb.index, algo)
    if algo.chosen_nll_coef:  # RPO: keeps the chosen answers likely (arXiv:2404.19733)
        best = mb.index.desirable > 0
        nll = -policy[best] / mb.seqs.loss_mask[best].sum(-1).cpu().clamp_min(1.0)
        per_example = per_example + algo.chosen_nll_coef * group_mean(
            nll, mb.index.group[best], mb.index.num_groups)
        metrics["pref/chosen_nll"] = float(nll.detach().mean()) if nll.numel() else 0.0
    return per_example.sum() / n_seq, metrics
