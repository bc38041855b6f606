"""Advantage estimators. One signature: ``fn(inputs, cfg) -> (advantages, returns)``.

Shapes: every tensor is [B, T] aligned with ``input_ids`` (see ``agentrt.core.types``); advantages and
returns are zero wherever ``loss_mask`` is zero. ``cfg`` is the policy's ``AlgorithmConfig``
(fields used: ``gamma``, ``lam``, ``norm_std``, ``eps``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import torch

Estimator = Callable[["AdvantageInputs", Any], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class AdvantageInputs:
    """Everything any estimator may read.

    Attributes:
        token_rewards: [B, T] reward at each token (outcome reward on a turn's last generated
            token, plus a per-token KL penalty when KL is placed in the reward).
        loss_mask: [B, T] 1.0 on generated tokens.
        group_ids: B group keys (the runner's ``GroupKey``; any hashable label for the
            estimators that only ask which rows share a group); group-relative baselines are
            computed within equal keys only.
        values: [B, T] critic values (GAE only).
    """

    token_rewards: torch.Tensor
    loss_mask: torch.Tensor
    group_ids: list[Hashable]
    values: torch.Tensor | None = None

    @property
    def scores(self) -> torch.Tensor:
        """[B] sequence score: sum of the rewards on generated tokens."""
        return (self.token_rewards * self.loss_mask).sum(-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over masked entries (unbiased variance), zero elsewhere."""
    mean = masked_mean(x, mask)
    n = mask.sum()
    var = (((x - mean) ** 2) * mask).sum() / (n - 1).clamp_min(1.0)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def _group_index(group_ids: list[Hashable]) -> dict[Hashable, list[int]]:
    """Row indices of each group, groups in the order they first appear."""
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[g].append(i)
    return groups


def _discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t'} where t' is the next generated token (env tokens skipped)."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    for t in reversed(range(rewards.shape[1])):
        m = mask[:, t]
        updated = rewards[:, t] + gamma * running
        running = torch.where(m > 0, updated, running)
        returns[:, t] = running * m
    return returns


def gae(inp: AdvantageInputs, cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016, arXiv:1506.02438).

    delta_t = r_t + gamma * V_{t'} - V_t; A_t = delta_t + gamma * lam * A_{t'}, where t' is the next
    generated token of the same sequence, so observation tokens between turns are skipped.
    Returns are A + V. Advantages are whitened over the batch when ``cfg.norm_adv``.
    """
    if inp.values is None:
        raise ValueError("gae needs critic values; enable the critic (algorithm: ppo)")
    rewards, mask, values = inp.token_rewards, inp.loss_mask, inp.values
    gamma, lam = cfg.gamma, cfg.lam
    bsz, width = rewards.shape
    adv = torch.zeros_like(rewards)
    last_gae = torch.zeros(bsz, dtype=rewards.dtype)
    next_value = torch.zeros(bsz, dtype=rewards.dtype)
    for t in reversed(range(width)):
        m = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        new_gae = delta + gamma * lam * last_gae
        last_gae = torch.where(m, new_gae, last_gae)
        next_value = torch.where(m, values[:, t], next_value)
        adv[:, t] = torch.where(m, new_gae, torch.zeros_like(new_gae))
    returns = (adv + values) * mask
    if cfg.norm_adv:
        adv = masked_whiten(adv, mask, cfg.eps)
    return adv, returns


def grpo(inp: AdvantageInputs, cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantage (Shao et al. 2024, arXiv:2402.03300, eq. 3).

    A_i = (s_i - mean(s_group)) / (std(s_group) + eps) with ``cfg.norm_std``, else s_i - mean
    (Dr. GRPO, arXiv:2503.20783). Std is unbiased. A group of one has no baseline: advantage 0.
    The same advantage is broadcast to every generated token of the sequence.
    """
    scores = inp.scores
    adv_seq = torch.zeros_like(scores)
    for rows in _group_index(inp.group_ids).values():
        if len(rows) < 2:
            continue
        idx = torch.tensor(rows)
        s = scores[idx]
        centered = s - s.mean()
        adv_seq[idx] = centered / (s.std() + cfg.eps) if cfg.norm_std else centered
    adv = adv_seq[:, None] * inp.loss_mask
    return adv, adv.clone()


def rloo(inp: AdvantageInputs, cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv:2402.14740).

    A_i = s_i - mean_{j != i} s_j = n / (n - 1) * (s_i - mean(s)). A group of one gets 0.
    """
    scores = inp.scores
    adv_seq = torch.zeros_like(scores)
    for rows in _group_index(inp.group_ids).values():
        n = len(rows)
        if n < 2:
            continue
        idx = torch.tensor(rows)
        s = scores[idx]
        adv_seq[idx] = (s - s.mean()) * n / (n - 1)
    adv = adv_seq[:, None] * inp.loss_mask
    return adv, adv.clone()


def reinforce_pp(inp: AdvantageInputs, cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): per-token discounted returns of the token
    rewards (KL penalty included when placed in the reward), whitened over the whole batch."""
    returns = _discounted_returns(inp.token_rewards, inp.loss_mask, cfg.gamma)
    adv = masked_whiten(returns, inp.loss_mask, cfg.eps)
    return adv, returns


def reinforce_pp_baseline(inp: AdvantageInputs, cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline subtracted from the outcome before whitening."""
    rewards = inp.token_rewards.clone()
    scores = inp.scores
    for rows in _group_index(inp.group_ids).values():
        idx = torch.tensor(rows)
        last = _last_index(inp.loss_mask[idx])
        rewards[idx, last] -= scores[idx].mean()
    returns = _discounted_returns(rewards, inp.loss_mask, cfg.gamma)
    adv = masked_whiten(returns, inp.loss_mask, cfg.eps)
    return adv, returns


def _last_index(mask: torch.Tensor) -> torch.Tensor:
    """[B] index of the last nonzero entry of each row of ``mask``."""
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    return (positions * (mask > 0)).max(dim=1).values
