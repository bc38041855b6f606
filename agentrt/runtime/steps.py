"""The pieces of a learner step that the learner, the pools and the workers share: token
alignment of log-probs and entropy, micro-batch slices, which metrics add up over shares, the
data-parallel hooks, advantages computed once on a whole batch, and one optimizer step
accumulated over micro-batches."""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from typing import Any, Callable, Iterator, Protocol

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from agentrt.algos import ADVANTAGES, KL_ESTIMATORS
from agentrt.algos.advantages import AdvantageInputs
from agentrt.algos.losses import entropy_from_logits
from agentrt.algos.rae import RAEState, use_rae_state
from agentrt.runtime.rollout.hf import token_logprobs
from agentrt.core.types import TrainBatch

log = logging.getLogger(__name__)


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
    """Hooks a data-parallel pool worker plugs into the learner (``agentrt.runtime.worker``).

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

    def passes(self, params: list[nn.Parameter], count: int) -> int:
        """Forward/backward passes to run for ``count`` micro-batches of this replica's own:
        more where every pass communicates (sharded parameters) and a peer has more."""


def advantages_from(batch: TrainBatch, algo: Any, kl_coef: float, rae_state: RAEState
                    ) -> dict[str, float]:
    """Fills ``batch.advantages`` and ``batch.returns`` with ``algo``'s estimator.

    A pool's driver runs it once on the whole batch gathered from its workers, with the
    policy's KL coefficient (``Learner.kl_coef``) and the driver's RAE baselines.
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


def old_logprobs_source(algo: Any, batch: TrainBatch, rollout_matches: bool) -> str:
    """Where the PPO ratio's old log-probs of ``batch`` come from (``algorithm.old_logprobs``).

    ``"update"``: one optimizer step on fresh samples starts from the rollout's weights, so
    its own forward pass, detached, gives exactly the old log-probs (ratio 1, the same
    gradient) and no forward pass is computed twice. ``"rollout"``: the rollout's
    (behaviour) log-probs, also what stale samples need, and what ``auto`` takes for several
    steps per batch where the rollout's numerics are the trainer's (``rollout_matches``: an
    fp32 HF rollout, see ``Learner.rollout_matches``). ``"recompute"``: a separate forward
    pass of the trainer in ``prepare``, exact however the rollout's numerics differ.
    """
    if algo.old_logprobs != "auto":
        return algo.old_logprobs
    if batch.stale:
        return "rollout"
    one_step = algo.ppo_epochs == 1 and algo.mini_batches == 1
    kl_in_reward = algo.kl.coef > 0.0 and algo.kl.placement == "reward"  # read before it
    if algo.train_dropout:
        return "recompute"
    if one_step and not kl_in_reward:
        return "update"
    return "rollout" if rollout_matches and not batch.replayed else "recompute"

def chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def optimizer_step(batch: Any, loss_fn: Callable[..., tuple[torch.Tensor, dict]],
                   optimizer: torch.optim.Optimizer, params: list[nn.Parameter], prefix: str,
                   micro_batches: Callable[[Any], list[list[int]]], device: torch.device,
                   max_grad_norm: float | None, dp: DataParallel | None) -> dict[str, float]:
    """One optimizer step on ``batch`` with gradient accumulation over micro-batches.

    ``loss_fn(micro_batch, n_tokens, n_seqs)`` returns the micro-batch's share of the
    mini-batch loss, so gradients equal those of one full-batch step; ``micro_batches(batch)``
    gives the rows of each. Under data parallel (``dp``) this replica trains on its rows and the
    counts stay the whole mini-batch's. A non-finite loss or gradient norm skips the step
    (gradients dropped, ``<prefix>/skipped`` 1).
    """
    n_tok = float(batch.loss_mask.sum().clamp_min(1.0))
    n_seq = float(((batch.loss_mask.sum(-1) > 0).sum()).clamp_min(1))
    local = batch if dp is None else batch.select(dp.local_rows(batch.size))
    optimizer.zero_grad(set_to_none=True)
    metrics: dict[str, list[float]] = defaultdict(list)
    total, finite = 0.0, True
    parts = micro_batches(local)
    passes = len(parts) if dp is None else dp.passes(params, len(parts))
    lockstep = dp is not None and any(isinstance(p, DTensor) for p in params)  # sharded
    for i in range(passes):
        loss, m = loss_fn(local.select(parts[min(i, len(parts) - 1)]).to(device), n_tok, n_seq)
        if i >= len(parts):  # a peer's extra pass: its collectives, no gradient of ours
            (loss * 0.0).backward()
            continue
        if not torch.isfinite(loss):
            finite = False
            if not lockstep:
                break
            loss.backward()  # sharded: every pass communicates; the step is skipped anyway
            continue
        loss.backward()
        total += float(loss.detach())
        for k, v in m.items():
            metrics[k].append(v)
    if dp is not None:  # every replica joins, also after a non-finite loss: all skip alike
        finite = dp.sync_grads(params, finite)
    grad_norm = float("nan")
    if finite:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm or float("inf"))
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        finite = math.isfinite(grad_norm)
    out = {k: sum(v) if is_share_metric(k) else sum(v) / len(v) for k, v in metrics.items()}
    out[f"{prefix}/grad_norm"] = grad_norm
    out[f"{prefix}/loss"] = total
    out[f"{prefix}/skipped"] = 0.0 if finite else 1.0
    if finite:
        optimizer.step()
    else:
        optimizer.zero_grad(set_to_none=True)
        log.warning("%s: non-finite loss or gradient; step skipped", prefix)
    return out
