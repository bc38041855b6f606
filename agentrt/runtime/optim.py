"""Optimizers, LR schedules and the critic of a policy's learner."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from agentrt.config.sections import OptimConfig

FUSED_DEVICES = ("cpu", "cuda")  # devices with torch's fused AdamW kernel


class ValueModel(nn.Module):
    """Critic: the policy's transformer body with a scalar head, initialised from policy weights.

    ``forward`` returns values aligned like log-probs: position t holds V(input_ids[:, :t]), the
    value of the state in which token t is generated.
    """

    def __init__(self, causal_lm: nn.Module) -> None:
        super().__init__()
        self.body = copy.deepcopy(causal_lm.get_decoder())
        hidden = causal_lm.config.hidden_size
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **inputs: Any) -> torch.Tensor:
        """[R, W] values of the rows given (``inputs``: position ids of packed rows)."""
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask,
                           **inputs).last_hidden_state
        values = self.head(hidden[:, :-1].float()).squeeze(-1)
        return torch.nn.functional.pad(values, (1, 0))


def make_optimizer(params: list[nn.Parameter], cfg: OptimConfig, lr: float | None = None
                   ) -> torch.optim.Optimizer:
    """AdamW, fused (one kernel over all parameters, as TRL's default ``adamw_torch_fused``)
    where ``cfg.fused`` and torch has the kernel: on CPU the per-parameter loop took 5-25x
    longer, 0.1-0.5 s of an update of llama-small (docs/performance.md)."""
    fused = cfg.fused and all(p.device.type in FUSED_DEVICES and p.is_floating_point()
                              for p in params)
    return torch.optim.AdamW(params, lr=lr or cfg.lr, betas=cfg.betas, eps=cfg.eps,
                             weight_decay=cfg.weight_decay, fused=fused or None)


def make_scheduler(opt: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int
                   ) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then constant, linear or cosine decay to ``min_lr_ratio``."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
        decay = 1.0 - progress if cfg.schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * decay

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def set_peak_lr(opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LambdaLR,
                lr: float) -> None:
    """Makes ``lr`` the schedule's peak from its current step on (a live LR change): every
    group's LR becomes ``lr`` times the schedule's factor now."""
    sched.base_lrs = [lr for _ in sched.base_lrs]
    for group, factor in zip(opt.param_groups, sched.lr_lambdas):
        group["initial_lr"] = lr
        group["lr"] = lr * factor(sched.last_epoch)
    sched._last_lr = [group["lr"] for group in opt.param_groups]  # noqa: SLF001
