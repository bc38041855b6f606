"""Policy workers: what one data-parallel replica of a policy pool runs.

A :class:`PolicyWorker` is a plain Python object holding a hybrid engine, or several LoRA policies
over one shared base model (one engine per adapter, all on the same peft model). Ray only carries
calls to it (``agentrt.pool`` wraps it with ``ray.remote``), so it is tested and used in-process
exactly as it runs in an actor.

Data parallelism (:class:`GlooDataParallel`): every replica receives the *whole* training batch,
draws the same mini-batch order (its shuffle generator is seeded like every other replica's), and
trains on its contiguous share of each mini-batch's rows. Losses are divided by the whole
mini-batch's token and sequence counts, so summing the replicas' gradients (one gloo all-reduce
per optimizer step, before clipping) gives exactly the single-process gradient and every replica
takes the identical step.
"""

from __future__ import annotations

import copy
import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from agentrt.algos import KL_CONTROLLERS, RAEState
from agentrt.config import PolicyConfig, SamplingConfig, SFTConfig
from agentrt.engine import (
    Completion,
    HybridEngine,
    ValueModel,
    is_share_metric,
    make_optimizer,
    make_scheduler,
)
from agentrt.types import TrainBatch



def split_rows(n: int, parts: int) -> list[slice]:
    """``parts`` contiguous near-equal slices of ``range(n)`` (the workers' shares)."""
    return [slice(i * n // parts, (i + 1) * n // parts) for i in range(parts)]


class GlooDataParallel:
    """The engine's data-parallel hooks over a torch.distributed process group (gloo on CPU).

    Args:
        rank: This replica's rank.
        world: Number of replicas.
    """

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def local_rows(self, n: int) -> slice:
        """Contiguous, near-equal shares; the pool makes every mini-batch have >= world rows."""
        return split_rows(n, self.world)[self.rank]

    def sync_grads(self, params: list[nn.Parameter], finite: bool) -> bool:
        """Sums gradients over replicas with one all-reduce of a flat bucket plus a NaN flag."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.detach().reshape(-1).float() for g in grads]
                         + [torch.zeros(1)])
        if not finite:  # this replica's loss was non-finite: flag it, send no garbage
            flat.zero_()
            flat[-1] = 1.0
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.numel()
            grad = flat[offset:offset + n].view_as(p).to(p.dtype)
            if p.grad is None:
                p.grad = grad.clone()
            else:
                p.grad.copy_(grad)
            offset += n
        return bool(flat[-1] == 0.0)

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Sums loss shares over replicas and averages the rest (same keys on every replica)."""
        keys = sorted(metrics)
        values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64)
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return {k: float(v) if is_share_metric(k) else float(v) / self.world
                for k, v in zip(keys, values.tolist())}


def _peft_config(cfg: PolicyConfig) -> Any:
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                          target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")


def share_base(base: HybridEngine, cfg: PolicyConfig, seed: int, total_steps: int
               ) -> HybridEngine:
    """Another LoRA policy on ``base``'s model: a new named adapter with its own optimizer,
    schedule, KL controller, shuffling and RAE state (mirrors ``HybridEngine.__init__``)."""
    if not (base.is_lora and cfg.lora.enabled):
        raise ValueError(f"policy {cfg.id!r}: several policies share a pool only as LoRA adapters "
                         "on one base (lora.enabled: true); give full-weight policies own pools")
    eng = copy.copy(base)  # shares model, tokenizer and rollout; generate passes its sampling
    eng.cfg, eng.policy_id, eng.algo, eng.version = cfg, cfg.id, cfg.algorithm, 0
    eng.adapter_name = cfg.id
    torch.manual_seed(seed)
    eng.model.add_adapter(cfg.id, _peft_config(cfg))
    eng.model.set_adapter(cfg.id)  # only this adapter's weights require grad now
    eng.ref_model = None  # LoRA: the reference is the base with adapters disabled
    eng.critic = ValueModel(eng._base_lm()) if eng.algo.critic else None
    params = [p for p in eng.model.parameters() if p.requires_grad]
    eng.optimizer = make_optimizer(params, cfg.optim)
    eng.scheduler = make_scheduler(eng.optimizer, cfg.optim, total_steps)
    eng.critic_optimizer = (make_optimizer(list(eng.critic.parameters()), cfg.optim,
                                           lr=eng.algo.critic_lr) if eng.critic else None)
    eng.kl_ctl = KL_CONTROLLERS.get(eng.algo.kl.controller)(eng.algo.kl)
    eng.shuffle_gen = torch.Generator().manual_seed(seed)
    eng.skipped_steps = 0
    eng.rae_state = RAEState.for_algorithm(eng.algo)
    return eng


@dataclass
class Prepared:
    """What a worker sends back from ``prepare`` for its rows of the batch ([rows, T] each)."""

    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    values: torch.Tensor | None
    metrics: dict[str, float]
    num_tokens: int
    kl_coef: float


def gather_prepared(batch: TrainBatch, prepared: list[Prepared]) -> dict[str, float]:
    """Writes the workers' per-row results into ``batch``; token-weighted mean of metrics."""
    cat = (lambda xs: xs[0] if len(xs) == 1 else torch.cat(xs))  # noqa: E731
    batch.old_logprobs = cat([p.old_logprobs for p in prepared])
    if prepared[0].ref_logprobs is not None:
        batch.ref_logprobs = cat([p.ref_logprobs for p in prepared])
    if prepared[0].values is not None:
        batch.values = cat([p.values for p in prepared])
    if len(prepared) == 1:
        return dict(prepared[0].metrics)
    total = max(1, sum(p.num_tokens for p in prepared))
    return {k: sum(p.metrics[k] * p.num_tokens for p in prepared) / total
            for k in prepared[0].metrics}


class PolicyWorker:
    """One replica: a hybrid engine per policy, LoRA policies sharing one base model.

    Args:
        policies: Policy configs (model.path set); two or more must all be LoRA on one base.
        seed: Seeds initialisation (policy ``i`` of a shared base uses ``seed + i``).
        total_steps: Steps the LR schedules span.
        threads: torch intra-op threads (None keeps torch's default).
    """

    def __init__(self, policies: list[PolicyConfig], seed: int = 0, total_steps: int = 1000,
                 threads: int | None = None, workdir: str | None = None) -> None:
        if threads:
            torch.set_num_threads(threads)
        first = HybridEngine(policies[0], seed=seed, workdir=workdir, total_steps=total_steps)
        self.engines: dict[str, HybridEngine] = {policies[0].id: first}
        for i, cfg in enumerate(policies[1:], start=1):
            if cfg.id in self.engines:
                raise ValueError(f"two policies named {cfg.id!r} in one pool")
            self.engines[cfg.id] = share_base(first, cfg, seed + i, total_steps)
        self.snapshots: dict[str, HybridEngine] = {}
        self.sft_state: dict[str, tuple[torch.optim.Optimizer, Any]] = {}
        self.dp: GlooDataParallel | None = None

    # ------------------------------------------------------------------ set-up
    def info(self) -> dict[str, Any]:
        """Process id (fault tests kill it), node, token ids and versions."""
        eng = next(iter(self.engines.values()))
        return {"pid": os.getpid(), "host": socket.gethostname(), "pad_id": eng.pad_id,
                "eos_id": eng.eos_id, "versions": self.versions()}

    def rendezvous_address(self) -> tuple[str, int]:
        """An address and free port of this node for the process group's TCP store."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), int(s.getsockname()[1])

    def init_data_parallel(self, address: str, port: int, rank: int, world: int,
                           timeout_s: float = 300.0) -> None:
        """Joins the pool's gloo process group and installs the engines' data-parallel hooks."""
        dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
        self.dp = GlooDataParallel(rank, world)
        for eng in self.engines.values():
            eng.data_parallel = self.dp

    def versions(self) -> dict[str, int]:
        return {k: e.version for k, e in {**self.engines, **self.snapshots}.items()}

    def _engine(self, name: str | None, trainable: bool = False) -> HybridEngine:
        """The policy (or snapshot) ``name``, its adapter made the active one."""
        if name is None:
            if len(self.engines) != 1:
                raise ValueError(f"this pool hosts {sorted(self.engines)}; name the adapter")
            name = next(iter(self.engines))
        eng = self.engines.get(name) or self.snapshots.get(name)
        if eng is None:
            raise KeyError(f"no policy or snapshot {name!r} here; have "
                           f"{sorted(self.engines) + sorted(self.snapshots)}")
        if trainable and name in self.snapshots:
            raise ValueError(f"{name!r} is a frozen snapshot; train its source policy instead")
        if eng.is_lora:
            eng.model.set_adapter(eng.adapter_name)
        return eng

    # ------------------------------------------------------------------ rollout and training
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig | None = None,
                 adapter: str | None = None) -> list[Completion]:
        eng = self._engine(adapter)
        return eng.generate(prompts, sampling or eng.cfg.rollout.sampling)

    def prepare(self, batch: TrainBatch, rows: slice, adapter: str | None = None) -> Prepared:
        """Old (and reference) log-probs and values of ``rows`` of the whole batch."""
        eng = self._engine(adapter, trainable=True)
        shard = batch.select(rows)
        metrics = eng.prepare(shard)
        return Prepared(shard.old_logprobs, shard.ref_logprobs, shard.values, metrics,
                        shard.num_tokens, eng.kl_ctl.coef)

    def update(self, batch: TrainBatch, adapter: str | None = None) -> dict[str, float]:
        """The engine's update on the whole batch (advantages filled); this replica's rows."""
        return self._engine(adapter, trainable=True).update(batch)

    def sft_step(self, batch: TrainBatch, sft: SFTConfig, adapter: str | None = None
                 ) -> dict[str, float]:
        """One supervised step; the first call builds the SFT optimizer like ``Trainer.sft``."""
        eng = self._engine(adapter, trainable=True)
        if eng.policy_id not in self.sft_state:
            params = [p for p in eng.model.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(params, lr=sft.lr, betas=eng.cfg.optim.betas)
            sched = make_scheduler(opt, eng.cfg.optim.model_copy(
                update={"warmup_steps": sft.warmup_steps, "schedule": "constant"}), sft.steps)
            self.sft_state[eng.policy_id] = (opt, sched)
        opt, sched = self.sft_state[eng.policy_id]
        metrics = eng.sft_update(batch, opt)
        sched.step()
        return self.dp.reduce_metrics(metrics) if self.dp is not None else metrics

    def end_sft(self, adapter: str | None = None) -> None:
        """Drops the SFT optimizer; RL starts from version 0 of the warm-started policy."""
        eng = self._engine(adapter, trainable=True)
        self.sft_state.pop(eng.policy_id, None)
        eng.version = 0
        eng.reset_reference()  # KL is measured against the warm-started policy, not the base

    def snapshot(self, adapter: str, tag: str) -> str:
        """Freezes a copy of LoRA policy ``adapter`` as the adapter ``"<adapter>@<tag>"``."""
        src = self._engine(adapter, trainable=True)
        name = f"{src.policy_id}@{tag}"
        if not src.is_lora:
            raise ValueError(f"{adapter!r} has full weights; snapshots are LoRA adapter copies "
                             "(load a checkpoint of it into its own pool instead)")
        if name in self.snapshots or name in self.engines:
            raise ValueError(f"snapshot {name!r} exists; pick another tag")
        snap = copy.copy(src)  # frozen view: shares model and tokenizer, own adapter and version
        snap.adapter_name, snap.policy_id = name, name
        snap.model.add_adapter(name, _peft_config(src.cfg))
        snap.load_trainable_state(src.trainable_state())
        self.snapshots[name] = snap
        return name

    # ------------------------------------------------------------------ state
    def state_dict(self, full: bool = True) -> dict[str, Any]:
        """Engine states per policy, snapshot weights and this process's torch RNG (only the RNG
        when not ``full``: replicas hold the same weights, a checkpoint needs them once)."""
        if not full:
            return {"rng": torch.get_rng_state()}
        return {
            "policies": {k: e.state_dict() for k, e in self.engines.items()},
            "snapshots": {k: {"source": k.split("@")[0], "tag": k.split("@", 1)[1],
                              "version": e.version, "weights": e.trainable_state()}
                          for k, e in self.snapshots.items()},
            "rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any], rank: int = 0) -> None:
        """Restores ``state``; ``state["rng"]`` may be one RNG state or a list (one per rank)."""
        for name, eng_state in state["policies"].items():
            self.engines[name].load_state_dict(eng_state)
        for name, snap in state["snapshots"].items():
            if name not in self.snapshots:
                self.snapshot(snap["source"], snap["tag"])
            self.snapshots[name].load_trainable_state(snap["weights"])
            self.snapshots[name].version = int(snap["version"])
        rng = state.get("rng")
        if isinstance(rng, list):
            rng = rng[rank % len(rng)] if rng else None
        if rng is not None:
            torch.set_rng_state(rng)

    def trainable_state(self, adapter: str | None = None) -> dict[str, torch.Tensor]:
        return self._engine(adapter).trainable_state()

    def save_pretrained(self, folder: str, adapter: str | None = None) -> str:
        return str(self._engine(adapter).save_pretrained(folder))
