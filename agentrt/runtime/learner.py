"""The learner of one policy: reference, critic, optimizer and the update steps.

A :class:`Learner` trains one policy through the :class:`~agentrt.runtime.shared_model.SharedModel`
that hosts it (the model and weights, and the rollout backend over the same weights). Several
LoRA policies on one base share one SharedModel, each with its own learner; a single-policy
learner builds its own. With the HF backend the rollout *is* the trainable module, so an update
is visible to the next rollout with no copy; vLLM receives the new weights in place after every
update (``SharedModel.sync``).

A pool's worker calls ``generate``, ``prepare`` and ``update`` (RL; the pool computes the
advantages in between, :func:`agentrt.runtime.steps.advantages_from`), ``sft_update`` (warm
start) or ``preference_update`` (dpo, ipo, kto, listwise). Its forward passes are a
:class:`~agentrt.runtime.forward.ForwardPasses`; its losses, functions of what they compute
(:mod:`agentrt.runtime.losses`).
"""

from __future__ import annotations

import functools
import logging
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from agentrt.algos import KL_CONTROLLERS
from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import PolicyConfig
from agentrt.core.types import TrainBatch
from agentrt.runtime.forward import ForwardPasses
from agentrt.runtime.learner_state import save_pretrained
from agentrt.runtime.losses import critic_loss, policy_loss, preference_loss, sft_loss
from agentrt.runtime.optim import ValueModel, make_optimizer, make_scheduler, set_peak_lr
from agentrt.runtime.reference import Reference
from agentrt.runtime.rollout.hf import Completion
from agentrt.runtime.shared_model import SharedModel
from agentrt.runtime.sharding import full_optimizer_state, sharded_optimizer_state
from agentrt.runtime.steps import DataParallel, chunks, old_logprobs_source, optimizer_step

log = logging.getLogger(__name__)

# Mean |rollout - trainer| log-prob per token up to which "auto" keeps the rollout's as the old
# log-probs (fp32 HF rollout: ~2e-7; bf16 autocast: ~1e-3; another temperature: 1e-1 or more).
ROLLOUT_MATCH_TOL = 1e-4


class Learner:
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
        self.cfg, self.policy_id, self.version, self.algo = cfg, cfg.id, 0, cfg.algorithm
        if shared is None:
            shared = SharedModel(cfg, seed=seed, workdir=workdir)
        elif cfg.id not in shared.adapters:  # the base's first policy is there already
            shared.add_policy(cfg, seed)
        self.shared = shared
        self.tokenizer, self.is_lora, self.device = shared.tokenizer, shared.is_lora, shared.device
        tok = self.tokenizer
        self.pad_id, self.eos_id = int(tok.pad_token_id), int(tok.eos_token_id)
        self.reference = Reference(shared, cfg.id, self.algo)
        torch.manual_seed(seed)
        self.critic = ValueModel(self._base_lm()).to(self.device) if self.algo.critic else None
        self.total_steps = total_steps
        self.rebuild_optimizer()
        self.critic_optimizer = (
            make_optimizer(list(self.critic.parameters()), cfg.optim, lr=self.algo.critic_lr)
            if self.critic is not None else None)
        self.kl_ctl = KL_CONTROLLERS.get(self.algo.kl.controller)(self.algo.kl)
        self.shuffle_gen = torch.Generator().manual_seed(seed)
        self.skipped_steps = 0
        # Data-parallel hooks a pool worker installs (set_data_parallel); None trains alone.
        self.data_parallel: DataParallel | None = None
        self.passes = ForwardPasses(shared, cfg)
        # An fp32 HF rollout of these weights computes the trainer's log-probs (gap ~2e-7 a
        # token): with several optimizer steps per batch "auto" takes the old log-probs from it,
        # not a separate forward pass; each update's first step checks ROLLOUT_MATCH_TOL.
        self.rollout_matches = cfg.rollout.backend == "hf" and shared.autocast_dtype is None
        self.sync_rollout()  # vLLM: serve this policy's weights from the start

    # ------------------------------------------------------------------ set-up
    @property
    def model(self) -> nn.Module:
        """The module this policy trains (shared with the other adapters of its base; the
        sharded trainer under ``resources.sharding: fsdp``)."""
        return self.shared.train_model

    @property
    def model_path(self) -> Path:
        return self.shared.path

    @property
    def kl_coef(self) -> float:
        """The KL controller's coefficient now (the reward's KL penalty, the loss's KL term)."""
        return self.kl_ctl.coef

    def parameters(self) -> list[nn.Parameter]:
        return self.shared.parameters(self.policy_id)

    def rebuild_optimizer(self) -> None:
        """A fresh optimizer and LR schedule over the policy's parameters as they are now (a
        sharded trainer replaced them)."""
        self.optimizer = make_optimizer(self.parameters(), self.cfg.optim)
        self.scheduler = make_scheduler(self.optimizer, self.cfg.optim, self.total_steps)

    def set_data_parallel(self, hooks: DataParallel | None) -> None:
        self.data_parallel = hooks

    def _base_lm(self) -> nn.Module:
        model = self.shared.model  # the full weights also where a sharded trainer trains
        return model.get_base_model() if self.is_lora else model

    def end_warm_start(self) -> None:
        """RL begins from the warm-started weights: version 0 again, KL measured against them
        (the reference), a fresh critic (and optimizer) reading their body, and the rollout
        engine's copy at version 0 too."""
        self.version = 0
        self.reference.rebase()
        if self.critic is not None:
            self.critic = ValueModel(self._base_lm()).to(self.device)
            self.critic_optimizer = make_optimizer(list(self.critic.parameters()),
                                                   self.cfg.optim, lr=self.algo.critic_lr)
        self.sync_rollout()

    @property
    def uses_reference(self) -> bool:
        """KL to the reference is on (in the loss or the reward)."""
        return self.algo.kl.coef > 0.0

    # ------------------------------------------------------------------ rollout, log-probs
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig | None = None
                 ) -> list[Completion]:
        """Samples one response per prompt as this policy.

        Args:
            prompts: Token-id lists (non-empty).
            sampling: Overrides ``cfg.rollout.sampling`` (temperature 0 means greedy).
        """
        return self.shared.generate(prompts, sampling or self.cfg.rollout.sampling,
                                    self.policy_id)

    def logprobs(self, batch: TrainBatch, reference: bool = False, scaled: bool = True
                 ) -> torch.Tensor:
        """[B, T] log-probs of ``batch.input_ids`` under the policy (or the reference), of the
        sampling distribution when ``scaled`` (logits / temperature), else of the model itself."""
        return self.passes.logprobs(batch, self.reference.name if reference else self.policy_id,
                                    scaled)

    # ------------------------------------------------------------------ algorithm steps
    def old_logprobs_source(self, batch: TrainBatch) -> str:
        """``"update"``, ``"rollout"`` or ``"recompute"``: where the PPO ratio's old log-probs
        of ``batch`` come from (:func:`agentrt.runtime.steps.old_logprobs_source`)."""
        return old_logprobs_source(self.algo, batch, self.rollout_matches)

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
            batch.values = self.passes.values(self.critic, batch)
        return metrics

    def optimize(self, batch: Any, loss_fn: Callable[..., tuple[torch.Tensor, dict]],
                 optimizer: torch.optim.Optimizer, params: list[nn.Parameter], prefix: str
                 ) -> dict[str, float]:
        """One optimizer step on ``batch``, accumulated over its micro-batches
        (:func:`~agentrt.runtime.steps.optimizer_step`); a skipped step is counted."""
        metrics = optimizer_step(batch, loss_fn, optimizer, params, prefix,
                                 self.passes.micro_batches, self.device,
                                 self.cfg.optim.max_grad_norm, self.data_parallel)
        self.skipped_steps += int(metrics[f"{prefix}/skipped"])
        return metrics

    def actor_loss(self, mb: TrainBatch, n_tok: float, n_seq: float,
                   old_from_update: bool = False, rollout_diff: bool = False
                   ) -> tuple[torch.Tensor, dict[str, float]]:
        """A micro-batch's share of the policy loss (:func:`agentrt.runtime.losses.policy_loss`)."""
        fwd = self.passes.forward(self.model, mb)
        return policy_loss(fwd.logprobs(), fwd.entropy(grad=bool(self.algo.entropy_coef)), mb,
                           self.algo, self.kl_coef, n_tok, n_seq, old_from_update, rollout_diff)

    def _critic_loss(self, mb: TrainBatch, n_tok: float, n_seq: float
                     ) -> tuple[torch.Tensor, dict[str, float]]:
        return critic_loss(self.passes.critic_values(self.critic, mb), mb, self.algo, n_tok, n_seq)

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """PPO-style update: ``ppo_epochs`` passes of ``mini_batches`` optimizer steps each.

        Requires ``prepare`` and the advantages (:func:`~agentrt.runtime.steps.advantages_from`)
        to have filled the batch. Bumps ``version`` and steps the LR schedule and KL controller.
        """
        algo = self.algo
        actor_params = self.parameters()  # also makes this policy's adapter the active one
        history: dict[str, list[float]] = defaultdict(list)
        source = self.old_logprobs_source(batch)
        with self.passes.training(self.algo.train_dropout):
            for epoch in range(algo.ppo_epochs):
                order = (torch.randperm(batch.size, generator=self.shuffle_gen)
                         if algo.mini_batches > 1 else torch.arange(batch.size))
                for i, part in enumerate(chunks(batch.size,
                                                math.ceil(batch.size / algo.mini_batches))):
                    mb = batch.select(order[part])
                    # the first step's weights are the rollout's: its forward measures the gap
                    loss_fn = functools.partial(
                        self.actor_loss, old_from_update=source == "update",
                        rollout_diff=source != "recompute" and epoch == 0 and i == 0)
                    step = self.optimize(mb, loss_fn, self.optimizer, actor_params, "actor")
                    if self.critic is not None:
                        step |= self.optimize(mb, self._critic_loss, self.critic_optimizer,
                                              list(self.critic.parameters()), "critic")
                    for k, v in step.items():
                        history[k].append(v)
        metrics = {k: sum(v) / len(v) for k, v in history.items()} | self.passes.padding_metrics()
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
        self.reference.after_update(self.version)
        return metrics | self.sync_rollout()

    def reconfigure(self, cfg: PolicyConfig) -> None:
        """Takes a live change of this policy's sampling and learning rate
        (agentrt.controller.control): the rollout samples with ``cfg.rollout.sampling`` from now
        on and the trainer's log-probs use its temperature; the LR schedule goes on from its step
        with ``cfg.optim.lr`` as its peak. Other fields must not differ from the policy's."""
        self.cfg = cfg
        self.passes.reconfigure(cfg)
        set_peak_lr(self.optimizer, self.scheduler, cfg.optim.lr)

    def sync_rollout(self) -> dict[str, float]:
        """Pushes the current weights into a separate rollout engine (vLLM) in place; the HF
        rollout shares them. Called after every update, and after a resume or a reset."""
        seconds = self.shared.sync(self.policy_id, self.version)
        timed = self.shared.vllm is not None or self.shared.trainer is not None
        return {"timing_s/sync": seconds} if timed else {}

    def sft_update(self, batch: TrainBatch, optimizer: torch.optim.Optimizer) -> dict[str, float]:
        """One supervised step: token-mean cross-entropy on ``loss_mask`` tokens, dropout on."""
        def loss_fn(mb: TrainBatch, n_tok: float, n_seq: float) -> tuple[torch.Tensor, dict]:
            logp = self.passes.forward(self.model, mb, scaled=False).logprobs()
            return sft_loss(logp, mb.loss_mask, n_tok, n_seq)

        params = self.parameters()
        with self.passes.training(dropout=True):  # as in ordinary fine-tuning
            metrics = self.optimize(batch, loss_fn, optimizer, params, "sft")
        metrics |= self.passes.padding_metrics()
        self.version += 1
        return metrics | self.sync_rollout()

    def preference_update(self, batch: Any) -> dict[str, float]:
        """One optimizer step of the policy's preference loss (dpo, ipo, kto, listwise).

        Args:
            batch: A :class:`~agentrt.runtime.preference.PreferenceBatch` whose ``ref_logps`` are
                set; micro-batches and data-parallel shares never split an example.
        """
        def loss_fn(mb: Any, n_tok: float, n_seq: float) -> tuple[torch.Tensor, dict]:
            logp = self.passes.forward(self.model, mb.seqs, scaled=False).logprobs()
            return preference_loss(logp, mb, self.algo, n_seq)

        params = self.parameters()
        with self.passes.training(self.algo.train_dropout):
            metrics = self.optimize(batch, loss_fn, self.optimizer, params, "actor")
        metrics |= self.passes.padding_metrics()
        if self.data_parallel is not None:
            metrics = self.data_parallel.reduce_metrics(metrics)
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        metrics["pref/examples"] = float(batch.size)
        self.scheduler.step()
        self.version += 1
        return metrics | self.sync_rollout()

    # ------------------------------------------------------------------ saved state
    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The weights that training changes (adapter only for LoRA policies)."""
        return self.shared.weights(self.policy_id)

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        """New weights for this policy (a resume, a league reset), pushed into the rollout."""
        self.shared.load_weights(self.policy_id, state)
        self.sync_rollout()

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint: weights, optimizers, schedule, KL controller and the shuffling stream."""
        critic, critic_opt = self.critic, self.critic_optimizer
        return {
            "model": self.trainable_state(),
            "optimizer": full_optimizer_state(self.optimizer),  # sharded: a collective
            "scheduler": self.scheduler.state_dict(),
            "critic": critic.state_dict() if critic is not None else None,
            "critic_optimizer": critic_opt.state_dict() if critic_opt is not None else None,
            "kl_ctl": self.kl_ctl.state_dict(),
            "version": self.version,
            "shuffle_gen": self.shuffle_gen.get_state(),
            "skipped_steps": self.skipped_steps,
            "reference": self.reference.state(),  # a warm-started one (None: rebuilt)
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(
            sharded_optimizer_state(self.optimizer, state["optimizer"]))
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.kl_ctl.load_state_dict(state["kl_ctl"])
        self.version = int(state["version"])
        self.shuffle_gen.set_state(state["shuffle_gen"])
        self.skipped_steps = int(state["skipped_steps"])
        self.reference.load(state.get("reference"))
        self.load_trainable_state(state["model"])  # last: syncs the rollout at this version

    def save_pretrained(self, folder: str | Path) -> Path:
        """Writes the policy in Hugging Face format (the adapter alone for LoRA policies)."""
        return save_pretrained(self.shared, self.policy_id, folder)
