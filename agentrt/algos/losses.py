"""Policy, value and SFT losses as per-token matrices, plus the one aggregation step.

One signature for policy losses: ``fn(logprobs, old_logprobs, advantages, mask, cfg) ->
(token_loss [B, T], metrics)``. Aggregation to a scalar is separate (:func:`aggregate`) so every
loss supports token-mean and sequence-mean, and micro-batches sum exactly to their mini-batch.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def _masked_mean_item(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((x * mask).sum() / mask.sum().clamp_min(1.0)).item())


def ppo_clip(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
             mask: torch.Tensor, cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, eq. 7) with optional dual clip.

    L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)); with ``cfg.clip_ratio_c`` (> 1) the loss
    of negative-advantage tokens is further capped at -A * c (Ye et al. 2020, arXiv:1912.09729).
    """
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    clipped = torch.maximum(loss1, loss2)
    metrics = {
        "actor/clipfrac": _masked_mean_item((loss2 > loss1).float(), mask),
        "actor/ppo_kl": _masked_mean_item(-log_ratio, mask),
    }
    if cfg.clip_ratio_c is not None:
        capped = torch.minimum(clipped, -advantages * cfg.clip_ratio_c)
        clipped = torch.where(advantages < 0, capped, clipped)
        metrics["actor/dual_clipfrac"] = _masked_mean_item(
            ((advantages < 0) & (capped < torch.maximum(loss1, loss2))).float(), mask
        )
    return clipped * mask, metrics


def vanilla_pg(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
               mask: torch.Tensor, cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE: -A * log pi(a|s). Its gradient equals PPO's when the ratio is exactly 1."""
    del old_logprobs, cfg
    return -advantages * logprobs * mask, {}


def aggregate(
    token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Reduces a [B, T] loss to a scalar.

    Args:
        mode: "token-mean" (sum over all tokens / token count), "seq-mean-token-mean" (mean over
            sequences of each sequence's token mean) or "seq-mean-token-sum".
        num_tokens, num_seqs: Denominators of the whole mini-batch when ``token_loss`` is one of
            its micro-batches, so that the micro-batch losses add up to the mini-batch loss.
    """
    mask = mask.to(token_loss.dtype)
    if mode == "token-mean":
        denom = num_tokens if num_tokens is not None else mask.sum().clamp_min(1.0)
        return (token_loss * mask).sum() / denom
    per_seq_tokens = mask.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = (token_loss * mask).sum(-1) / per_seq_tokens.clamp_min(1.0)
    elif mode == "seq-mean-token-sum":
        per_seq = (token_loss * mask).sum(-1)
    else:
        raise KeyError(f"unknown loss aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")
    has_tokens = (per_seq_tokens > 0).to(token_loss.dtype)
    denom = num_seqs if num_seqs is not None else has_tokens.sum().clamp_min(1.0)
    return (per_seq * has_tokens).sum() / denom


def value_token_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss 0.5 * max((V - R)^2, (V_clip - R)^2), as in PPO2 (openai/baselines)."""
    unclipped = (values - returns) ** 2
    if clip is None:
        loss = 0.5 * unclipped
        frac = 0.0
    else:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (v_clip - returns) ** 2
        loss = 0.5 * torch.maximum(unclipped, clipped)
        frac = _masked_mean_item((clipped > unclipped).float(), mask)
    return loss * mask, {"critic/vf_clipfrac": frac}


def sft_token_loss(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the masked (target) tokens: -log p(token)."""
    return -logprobs * mask


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """[B, T, V] logits -> [B, T] entropy of the softmax, H = logsumexp(z) - sum(p z)."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)
