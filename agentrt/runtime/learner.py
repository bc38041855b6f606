"""The learner of one policy: reference, critic, optimizer and the update steps.

A :class:`HybridEngine` trains one policy through the :class:`~agentrt.runtime.shared_model.SharedModel` that
hosts it (the model and weights, and the rollout backend over the same weights). Several LoRA
policies on one base share one SharedModel, each with its own engine; a single-policy engine
builds its own. With the HF backend the rollout *is* the trainable module, so an update is visible
to the next rollout with no copy; vLLM receives the new weights in place after every update
(``SharedModel.sync``).

The trainer calls ``generate``, ``prepare``, ``compute_advantages`` and ``update`` (RL),
``sft_update`` (warm start) or ``preference_update`` (dpo, ipo, kto, listwise).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from agentrt.algos import KL_CONTROLLERS, RAEState
from agentrt.config.sections import PolicyConfig, SamplingConfig
from agentrt.runtime.learner_state import EngineState
from agentrt.runtime.losses import critic_loss, policy_loss, preference_loss, sft_loss
from agentrt.runtime.optim import ValueModel, make_optimizer, make_scheduler
from agentrt.runtime.packing import (Forward, Layout, check_packing, layout, plan_micro_batches,
                             trained_prefix)
from agentrt.runtime.rollout.hf import Completion
from agentrt.runtime.steps import (
    DataParallel,
    advantages_from,
    chunks,
    is_share_metric,
)
from agentrt.core.types import TrainBatch
from agentrt.runtime.shared_model import SharedModel

log = logging.getLogger(__name__)

# Mean |rollout - trainer| log-prob per token up to which "auto" keeps the rollout's as the old
# log-probs (fp32 HF rollout: ~2e-7; bf16 autocast: ~1e-3; another temperature: 1e-1 or more).
ROLLOUT_MATCH_TOL = 1e-4


class HybridEngine(EngineState):
    """The learner of one policy over the shared model that hosts it.

    Args:
        cfg: The policy's config.
        seed: Seeds LoRA/critic initialisation and mini-batch shuffling.
        workdir: Where a preset model is built (default: a temporary folder).
        total_steps: Training steps the LR schedule spans (linear/cosine decay).
        shared: The base this policy joins as one more LoRA adapter; None builds its own.
    """

    def __init__(self, cfg: PolicyConfig, seed: int = 0, workdir: str | Path | None = None,
                 total_steps: int = 1000, shared: SharedModel | None = None) -> None:
        self.cfg = cfg
        self.policy_id = cfg.id
        self.version = 0
        self.algo = cfg.algorithm
        if shared is None:
            shared = SharedModel(cfg, seed=seed, workdir=workdir)
        elif cfg.id not in shared.adapters:  # the base's first policy is there already
            shared.add_policy(cfg, seed)
        self.shared = shared
        self.tokenizer = shared.tokenizer
        self.is_lora = shared.is_lora
        self.device = shared.device
        self.autocast_dtype = shared.autocast_dtype
        # The KL / online-preference reference: None is the model folder's weights (LoRA: the
        # base with adapters off; full weights: a frozen copy); after reset_reference() it is
        # the snapshot "<policy>@ref" of the warm-started weights.
        self.reference: str | None = None
        if self.needs_reference and not self.is_lora:
            self.reference = f"{self.policy_id}@ref"
            shared.freeze(self.policy_id, self.reference, serve=False)
        self.ref_is_warm_start = False
        torch.manual_seed(seed)
        self.critic = (ValueModel(self._base_lm()).to(self.device) if self.algo.critic
                       else None)
        self.optimizer = make_optimizer(self.parameters(), cfg.optim)
        self.scheduler = make_scheduler(self.optimizer, cfg.optim, total_steps)
        self.critic_optimizer = (
            make_optimizer(list(self.critic.parameters()), cfg.optim, lr=self.algo.critic_lr)
            if self.critic is not None else None
        )
        self.kl_ctl = KL_CONTROLLERS.get(self.algo.kl.controller)(self.algo.kl)
        self.shuffle_gen = torch.Generator().manual_seed(seed)
        self.skipped_steps = 0
        # Per-(env, role, policy) baselines of the stateful "rae" estimator; others ignore it.
        self.rae_state = RAEState.for_algorithm(self.algo)
        # Data-parallel hooks a pool worker installs (set_data_parallel); None trains alone.
        self.data_parallel: DataParallel | None = None
        # Positions the trainer's forward passes computed, how many were tokens, and the tokens
        # a shared prompt saved (metrics of the next update).
        self.computed_positions, self.computed_tokens, self.shared_tokens = 0, 0, 0
        if cfg.packing:
            check_packing(self.model, self.device, cfg.share_prefix)
        # policy.compile: forward passes with gradients (the update's) call the model through
        # torch.compile, dynamic shapes as every update's packed rows differ; the no-grad
        # log-prob passes (recompute, reference: weights swapped in) and the rollout stay eager.
        self.compiled = torch.compile(self.model, dynamic=True) if cfg.compile else None
        # An fp32 rollout of these weights by the HF backend computes the trainer's log-probs
        # (measured gap ~2e-7 a token): with several optimizer steps per batch, "auto" takes the
        # old log-probs from it instead of a separate forward pass, while every update's first
        # step measures the gap and turns this off past ROLLOUT_MATCH_TOL.
        self.rollout_matches = cfg.rollout.backend == "hf" and self.autocast_dtype is None
        self.sync_rollout()  # vLLM: serve this policy's weights from the start

    # ------------------------------------------------------------------ set-up helpers
    @property
    def model(self) -> nn.Module:
        """The module this policy trains (shared with the other adapters of its base)."""
        return self.shared.model

    @property
    def model_path(self) -> Path:
        return self.shared.path

    def parameters(self) -> list[nn.Parameter]:
        return self.shared.parameters(self.policy_id)

    def restart_version(self) -> None:
        """Version 0 again: the warm start is over and RL begins from these weights."""
        self.version = 0

    def set_data_parallel(self, hooks: DataParallel | None) -> None:
        self.data_parallel = hooks

    def _base_lm(self) -> nn.Module:
        return self.model.get_base_model() if self.is_lora else self.model

    def rebase_critic(self) -> None:
        """A fresh critic (and its optimizer) from the current policy weights: after a warm
        start the critic should read the warm-started body, not the one the run began with."""
        if self.critic is None:
            return
        self.critic = ValueModel(self._base_lm()).to(self.device)
        self.critic_optimizer = make_optimizer(list(self.critic.parameters()), self.cfg.optim,
                                               lr=self.algo.critic_lr)

    def reset_reference(self) -> None:
        """Makes the current weights the reference (call after an SFT warm start): a frozen
        snapshot ``"<policy>@ref"`` (an adapter for LoRA policies, CPU weights otherwise)."""
        if not self.needs_reference:
            return
        if self.reference is not None:
            self.shared.drop(self.reference)
        self.reference = f"{self.policy_id}@ref"
        self.shared.freeze(self.policy_id, self.reference, serve=False)
        self.ref_is_warm_start = True

    @property
    def uses_reference(self) -> bool:
        """KL to the reference is on (in the loss or the reward)."""
        return self.algo.kl.coef > 0.0

    @property
    def needs_reference(self) -> bool:
        """The algorithm reads reference log-probs during training: KL on, or online preference
        learning (offline preference data gets its reference log-probs once, before training)."""
        return self.uses_reference or (self.algo.is_preference and self.algo.online)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @contextlib.contextmanager
    def _training(self) -> Iterator[None]:
        """Dropout on only where the config asks (``algorithm.train_dropout``)."""
        if self.algo.train_dropout:
            self.model.train()
        try:
            yield
        finally:
            self.model.eval()

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    @property
    def eos_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    # ------------------------------------------------------------------ rollout
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig | None = None
                 ) -> list[Completion]:
        """Samples one response per prompt as this policy.

        Args:
            prompts: Token-id lists (non-empty).
            sampling: Overrides ``cfg.rollout.sampling`` (temperature 0 means greedy).
        """
        return self.shared.generate(prompts, sampling or self.cfg.rollout.sampling,
                                    self.policy_id)

    # ------------------------------------------------------------------ forward passes
    def micro_batches(self, batch: Any) -> list[list[int]]:
        """Rows of each forward/backward micro-batch: ``micro_batch_size`` rows in batch order,
        or length buckets within ``micro_batch_tokens`` (agentrt.runtime.packing). A preference batch
        is split by examples, never by length."""
        size, budget = self.cfg.micro_batch_size, self.cfg.micro_batch_tokens
        if not isinstance(batch, TrainBatch):
            return [list(range(p.start, p.stop)) for p in chunks(batch.size, size)]
        return plan_micro_batches(batch.attention_mask.sum(-1).tolist(), size, budget,
                                  self.cfg.packing, input_ids=batch.input_ids,
                                  prefix=self.shared_prefix(batch) if budget else None)

    def shared_prefix(self, batch: TrainBatch) -> torch.Tensor | None:
        """[B] tokens before each row's first trained token, where rows of one prompt share it
        (``policy.share_prefix`` with packing); None where nothing is shared."""
        if not (self.cfg.packing and self.cfg.share_prefix):
            return None
        return trained_prefix(batch.loss_mask, batch.attention_mask)

    def layout(self, batch: TrainBatch, share: bool = True) -> Layout:
        """The rows a forward pass of ``batch`` computes: trimmed to its longest row, or packed
        (``policy.packing``), rows of one prompt computing it once (``policy.share_prefix``,
        where ``share``); counted for the padding metrics."""
        prefix = self.shared_prefix(batch) if share else None
        lay = layout(batch.input_ids, batch.attention_mask, self.cfg.packing, self.pad_id,
                     prefix, int(getattr(self.model.config, "hidden_size", 0) or 0))
        self.computed_positions += lay.computed
        self.computed_tokens += lay.tokens
        self.shared_tokens += lay.shared
        return lay

    def forward(self, model: nn.Module, batch: TrainBatch, scaled: bool = True) -> Forward:
        """One forward pass of ``batch``: its float logits, divided by the sampling temperature
        when ``scaled`` (so that log-probs match the distribution the rollout sampled from);
        ``.logprobs()`` and ``.entropy()`` read them in the batch's [B, T] rows."""
        lay = self.layout(batch)
        with self._autocast():
            run = self.compiled if self.compiled is not None and torch.is_grad_enabled() and \
                model is self.model else model
            inputs = lay.inputs(self.device)
            if run is self.compiled:
                # the embedding lookup outside the graph: inductor's backward of it scatters the
                # rows' gradients with atomic adds (5.5 ms of llama-small's update at 8.6k
                # positions, 1.0 with torch's own kernel; update 2.5% faster on llama-tiny)
                inputs["inputs_embeds"] = model.get_input_embeddings()(inputs.pop("input_ids"))
            out = run(**inputs)
        temp = (self.cfg.rollout.sampling.temperature or 1.0) if scaled else 1.0
        return Forward(out.logits.float() / temp, lay)

    def critic_values(self, batch: TrainBatch) -> torch.Tensor:
        """[B, T] critic values of ``batch`` (aligned like log-probs), with gradients."""
        assert self.critic is not None
        lay = self.layout(batch, share=False)  # values are read per position, not predicted
        return lay.unpack(self.critic(**lay.inputs(self.device)))

    def padding_metrics(self) -> dict[str, float]:
        """Padding the trainer's forward passes computed since the last call (log-prob passes
        and the update; this process's rows), then starts counting again."""
        padded = self.computed_positions - self.computed_tokens
        out = {"perf/padded_tokens": float(padded),
               "perf/pad_fraction": padded / max(1, self.computed_positions),
               "perf/shared_tokens": float(self.shared_tokens)}
        self.computed_positions, self.computed_tokens, self.shared_tokens = 0, 0, 0
        return out

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch, reference: bool = False, scaled: bool = True
                 ) -> torch.Tensor:
        """[B, T] log-probs of ``batch.input_ids`` under the policy (or the reference), of the
        sampling distribution when ``scaled`` (logits / temperature), else of the model itself."""
        out = torch.zeros(batch.input_ids.shape)
        name = (self.reference if reference else self.policy_id)
        for part in self.micro_batches(batch):
            with self.shared.using(name) as model:
                out[part] = self.forward(model, batch.select(part), scaled).logprobs().cpu()
        self.shared.activate(self.policy_id)
        return out * batch.loss_mask

    @torch.no_grad()
    def values(self, batch: TrainBatch) -> torch.Tensor:
        out = torch.zeros(batch.input_ids.shape)
        for part in self.micro_batches(batch):
            out[part] = self.critic_values(batch.select(part)).cpu()
        return out * batch.loss_mask

    # ------------------------------------------------------------------ algorithm steps
    def old_logprobs_source(self, batch: TrainBatch) -> str:
        """Where the PPO ratio's old log-probs of ``batch`` come from (``algorithm.old_logprobs``).

        ``"update"``: one optimizer step on fresh samples starts from the rollout's weights, so
        its own forward pass, detached, gives exactly the old log-probs (ratio 1, the same
        gradient) and no forward pass is computed twice. ``"rollout"``: the rollout's
        (behaviour) log-probs, also what stale samples need, and what ``auto`` takes for several
        steps per batch where the rollout's numerics are the trainer's (fp32, HF backend: see
        ``rollout_matches``). ``"recompute"``: a separate forward pass of the trainer in
        ``prepare``, exact however the rollout's numerics differ.
        """
        algo = self.algo
        if algo.old_logprobs != "auto":
            return algo.old_logprobs
        if batch.stale:
            return "rollout"
        one_step = algo.ppo_epochs == 1 and algo.mini_batches == 1
        kl_in_reward = self.uses_reference and algo.kl.placement == "reward"  # read before it
        if algo.train_dropout:
            return "recompute"
        if one_step and not kl_in_reward:
            return "update"
        return "rollout" if self.rollout_matches and not batch.replayed else "recompute"

    def prepare(self, batch: TrainBatch) -> dict[str, float]:
        """Fills old log-probs (when recomputed, see :meth:`old_logprobs_source`), reference
        log-probs (KL on) and values (critic).

        A recompute reports its gap to the rollout log-probs as rollout/logprob_diff; without it
        the update's first optimizer step reports that gap from its own forward pass.
        """
        metrics: dict[str, float] = {}
        if self.old_logprobs_source(batch) == "recompute":
            rollout_lp = batch.old_logprobs
            batch.old_logprobs = self.logprobs(batch)
            n = batch.loss_mask.sum().clamp_min(1.0)
            diff = ((rollout_lp - batch.old_logprobs).abs() * batch.loss_mask).sum() / n
            metrics["rollout/logprob_diff"] = float(diff)
        if self.uses_reference:
            batch.ref_logprobs = self.logprobs(batch, reference=True)
        if self.critic is not None:
            batch.values = self.values(batch)
        return metrics

    def compute_advantages(self, batch: TrainBatch) -> dict[str, float]:
        """Fills ``batch.advantages`` and ``batch.returns`` with the configured estimator."""
        return advantages_from(batch, self.algo, self.kl_ctl.coef, self.rae_state)

    def optimize(self, batch: TrainBatch, loss_fn: Callable[..., tuple[torch.Tensor, dict]],
                 optimizer: torch.optim.Optimizer, params: list[nn.Parameter], prefix: str
                 ) -> dict[str, float]:
        """One optimizer step on ``batch`` with gradient accumulation over micro-batches.

        ``loss_fn(micro_batch, n_tokens, n_seqs)`` returns the micro-batch's share of the
        mini-batch loss, so gradients equal those of one full-batch step. A non-finite loss or
        gradient norm skips the step (gradients dropped, counted in ``<prefix>/skipped``).
        """
        n_tok = float(batch.loss_mask.sum().clamp_min(1.0))
        n_seq = float(((batch.loss_mask.sum(-1) > 0).sum()).clamp_min(1))
        dp = self.data_parallel  # n_tok, n_seq stay the whole mini-batch's under data parallel
        local = batch if dp is None else batch.select(dp.local_rows(batch.size))
        optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, list[float]] = defaultdict(list)
        total, finite = 0.0, True
        for part in self.micro_batches(local):
            loss, m = loss_fn(local.select(part).to(self.device), n_tok, n_seq)
            if not torch.isfinite(loss):
                finite = False
                break
            loss.backward()
            total += float(loss.detach())
            for k, v in m.items():
                metrics[k].append(v)
        if dp is not None:  # every replica joins, also after a non-finite loss: all skip alike
            finite = dp.sync_grads(params, finite)
        grad_norm = float("nan")
        if finite:
            max_norm = self.cfg.optim.max_grad_norm or float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            finite = math.isfinite(grad_norm)
        out = {k: sum(v) if is_share_metric(k) else sum(v) / len(v) for k, v in metrics.items()}
        out[f"{prefix}/grad_norm"] = grad_norm
        out[f"{prefix}/loss"] = total
        out[f"{prefix}/skipped"] = 0.0 if finite else 1.0
        if finite:
            optimizer.step()
        else:
            optimizer.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            log.warning("%s: non-finite loss or gradient; step skipped", prefix)
        return out

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """PPO-style update: ``ppo_epochs`` passes of ``mini_batches`` optimizer steps each.

        Requires ``prepare`` and ``compute_advantages`` to have filled the batch. Bumps
        ``version`` and steps the LR schedule and KL controller once.
        """
        algo = self.algo
        actor_params = self.parameters()  # also makes this policy's adapter the active one
        history: dict[str, list[float]] = defaultdict(list)
        source = self.old_logprobs_source(batch)
        with self._training():
            for epoch in range(algo.ppo_epochs):
                order = (torch.randperm(batch.size, generator=self.shuffle_gen)
                         if algo.mini_batches > 1 else torch.arange(batch.size))
                for i, part in enumerate(chunks(batch.size,
                                                math.ceil(batch.size / algo.mini_batches))):
                    mb = batch.select(order[part])
                    # the first step's weights are the rollout's: its forward measures the gap
                    loss_fn = functools.partial(
                        policy_loss, self, old_from_update=source == "update",
                        rollout_diff=source != "recompute" and epoch == 0 and i == 0)
                    for k, v in self.optimize(mb, loss_fn, self.optimizer,
                                              actor_params, "actor").items():
                        history[k].append(v)
                    if self.critic is not None:
                        for k, v in self.optimize(mb, functools.partial(critic_loss, self),
                                                  self.critic_optimizer,
                                                  list(self.critic.parameters()), "critic").items():
                            history[k].append(v)
        metrics = {k: sum(v) / len(v) for k, v in history.items()} | self.padding_metrics()
        if self.data_parallel is not None:  # whole-batch values, the same on every replica
            metrics = self.data_parallel.reduce_metrics(metrics)
        gap = metrics.get("rollout/logprob_diff", 0.0)
        if source == "rollout" and self.algo.old_logprobs == "auto" and not batch.stale and \
                not gap <= ROLLOUT_MATCH_TOL:
            log.warning("policy %s: the rollout's log-probs are %.2g a token from the trainer's "
                        "(more than %g): old log-probs are recomputed from now on",
                        self.policy_id, gap, ROLLOUT_MATCH_TOL)
            self.rollout_matches = False
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        metrics["actor/kl_coef"] = self.kl_ctl.coef
        self.scheduler.step()
        if self.uses_reference:
            self.kl_ctl.update(metrics.get("actor/kl", 0.0), batch.size)
        self.version += 1
        return metrics | self.sync_rollout()

    def reconfigure(self, cfg: PolicyConfig) -> None:
        """Takes a live change of this policy's sampling and learning rate (agentrt.controller.control):
        the rollout samples with ``cfg.rollout.sampling`` from now on and the trainer's log-probs
        use its temperature; the LR schedule goes on from its step with ``cfg.optim.lr`` as
        its peak. Other fields must not differ from the policy's config."""
        self.cfg = cfg
        sched = self.scheduler
        sched.base_lrs = [cfg.optim.lr for _ in sched.base_lrs]
        for group, factor in zip(self.optimizer.param_groups, sched.lr_lambdas):
            group["initial_lr"] = cfg.optim.lr
            group["lr"] = cfg.optim.lr * factor(sched.last_epoch)
        sched._last_lr = [group["lr"] for group in self.optimizer.param_groups]  # noqa: SLF001

    def sync_rollout(self) -> dict[str, float]:
        """Pushes the current weights into a separate rollout engine (vLLM) in place; the HF
        rollout shares them. Called after every update, and after a resume or a reset."""
        seconds = self.shared.sync(self.policy_id, self.version)
        return {"timing_s/sync": seconds} if self.shared.vllm is not None else {}

    def sft_update(self, batch: TrainBatch, optimizer: torch.optim.Optimizer) -> dict[str, float]:
        """One supervised step: token-mean cross-entropy on ``loss_mask`` tokens (dropout on, as
        in ordinary fine-tuning)."""

        params = self.parameters()
        self.model.train()
        try:
            metrics = self.optimize(batch, functools.partial(sft_loss, self), optimizer, params,
                                    "sft")
        finally:
            self.model.eval()
        metrics |= self.padding_metrics()
        self.version += 1
        return metrics | self.sync_rollout()

    def preference_update(self, batch: Any) -> dict[str, float]:
        """One optimizer step of the policy's preference loss (dpo, ipo, kto, listwise).

        Args:
            batch: A :class:`~agentrt.runtime.preference.PreferenceBatch` whose ``ref_logps`` are set;
                micro-batches and data-parallel shares never split an example.
        """
        params = self.parameters()
        with self._training():
            metrics = self.optimize(batch, functools.partial(preference_loss, self), self.optimizer,
                                    params, "actor")
        metrics |= self.padding_metrics()
        if self.data_parallel is not None:
            metrics = self.data_parallel.reduce_metrics(metrics)
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        metrics["pref/examples"] = float(batch.size)
        self.scheduler.step()
        self.version += 1
        return metrics | self.sync_rollout()
