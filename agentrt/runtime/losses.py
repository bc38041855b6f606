"""The loss of one micro-batch, per kind of update: policy (RL), critic, SFT and preference.

Each is ``loss(engine, mb, n_tok, n_seq) -> (loss, metrics)``, the micro-batch's share of its
mini-batch's loss (``n_tok``/``n_seq`` count the mini-batch), which
:meth:`agentrt.runtime.learner.HybridEngine.optimize` accumulates into one optimizer step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from agentrt.algos import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    PREFERENCE_LOSSES,
    aggregate,
    sequence_logps,
    sft_token_loss,
    value_token_loss,
)
from agentrt.algos.preference import group_mean
from agentrt.core.types import TrainBatch

if TYPE_CHECKING:
    from agentrt.runtime.learner import HybridEngine


def policy_loss(engine: HybridEngine, mb: TrainBatch, n_tok: float, n_seq: float,
                old_from_update: bool = False, rollout_diff: bool = False
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """A micro-batch's share of the policy loss. ``old_from_update``: the old log-probs are
    this forward's own, detached; ``rollout_diff``: report the gap of this forward's
    log-probs to ``mb.old_logprobs`` (the rollout's) as rollout/logprob_diff."""
    algo = engine.algo
    fwd = engine.forward(engine.model, mb)
    logp = fwd.logprobs()
    old = logp.detach() if old_from_update else mb.old_logprobs
    token_loss, metrics = POLICY_LOSSES.get(algo.policy_loss)(
        logp, old, mb.advantages, mb.loss_mask, algo)
    if rollout_diff:  # a share of the mini-batch's token mean: micro-batches add up
        gap = (logp.detach() - mb.old_logprobs).abs() * mb.loss_mask
        metrics["rollout/logprob_diff"] = float(gap.sum()) / n_tok
    agg = lambda x: aggregate(x, mb.loss_mask, algo.loss_agg, n_tok, n_seq)  # noqa: E731
    pg_loss = agg(token_loss)
    entropy = agg(fwd.entropy(grad=bool(algo.entropy_coef)))
    loss = pg_loss - algo.entropy_coef * entropy
    metrics.update({"actor/pg_loss": float(pg_loss.detach()),
                    "actor/entropy": float(entropy.detach())})
    if engine.uses_reference:
        kl = agg(KL_ESTIMATORS.get(algo.kl.estimator)(logp, mb.ref_logprobs))
        if algo.kl.placement == "loss":
            loss = loss + engine.kl_ctl.coef * kl
        metrics["actor/kl"] = float(kl.detach())
    return loss, metrics


def critic_loss(engine: HybridEngine, mb: TrainBatch, n_tok: float, n_seq: float
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """A micro-batch's share of the value loss (scaled by ``vf_coef``)."""
    values = engine.critic_values(mb)
    token_loss, metrics = value_token_loss(values, mb.values, mb.returns, mb.loss_mask,
                                           engine.algo.value_clip)
    loss = aggregate(token_loss, mb.loss_mask, engine.algo.loss_agg, n_tok, n_seq)
    metrics["critic/vf_loss"] = float(loss.detach())
    return engine.algo.vf_coef * loss, metrics


def sft_loss(engine: HybridEngine, mb: TrainBatch, n_tok: float, n_seq: float
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """A micro-batch's share of the token-mean cross-entropy on ``loss_mask`` tokens."""
    logp = engine.forward(engine.model, mb, scaled=False).logprobs()
    return aggregate(sft_token_loss(logp, mb.loss_mask), mb.loss_mask, "token-mean", n_tok,
                     n_seq), {}


def preference_loss(engine: HybridEngine, mb: Any, n_tok: float, n_seq: float
                    ) -> tuple[torch.Tensor, dict[str, float]]:
    """A micro-batch's share of the mean per-example preference loss of its mini-batch
    (``optimize``'s ``loss_fn``; ``n_seq`` counts the mini-batch's examples)."""
    del n_tok
    algo = engine.algo
    policy = sequence_logps(engine.forward(engine.model, mb.seqs, scaled=False).logprobs(),
                            mb.seqs.loss_mask.to(engine.device)).cpu()
    per_example, metrics = PREFERENCE_LOSSES.get(str(algo.preference_loss))(
        policy, mb.ref_logps, mb.index, algo)
    if algo.chosen_nll_coef:  # RPO: keeps the chosen answers likely (arXiv:2404.19733)
        best = mb.index.desirable > 0
        nll = -policy[best] / mb.seqs.loss_mask[best].sum(-1).cpu().clamp_min(1.0)
        per_example = per_example + algo.chosen_nll_coef * group_mean(
            nll, mb.index.group[best], mb.index.num_groups)
        metrics["pref/chosen_nll"] = float(nll.detach().mean()) if nll.numel() else 0.0
    return per_example.sum() / n_seq, metrics
