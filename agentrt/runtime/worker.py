"""Policy workers: what one data-parallel replica of a policy pool runs.

A :class:`PolicyWorker` is a plain Python object holding the learner of one policy, or of several
LoRA policies over one shared base model (one learner per adapter, all on the same peft model).
Ray only carries calls to it (``agentrt.runtime.ray_pool`` wraps it with ``ray.remote``), so it is
tested and used in-process exactly as it runs in an actor.

Data parallelism (:class:`GlooDataParallel`): every replica receives the *whole* training batch,
draws the same mini-batch order (its shuffle generator is seeded like every other replica's), and
trains on its contiguous share of each mini-batch's rows. Losses are divided by the whole
mini-batch's token and sequence counts, so summing the replicas' gradients (one gloo all-reduce
per optimizer step, before clipping) gives exactly the single-process gradient and every replica
takes the identical step.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from agentrt.runtime.allocator import keep_freed_memory
from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import PolicyConfig, SFTConfig
from agentrt.runtime.learner import Learner
from agentrt.runtime.rollout.hf import Completion
from agentrt.runtime.steps import is_share_metric
from agentrt.runtime.optim import make_optimizer, make_scheduler
from agentrt.core.types import TrainBatch
from agentrt.runtime.shared_model import ModuleCopy, SharedModel


def bind_collectives_to(host: str) -> None:
    """Points gloo's and NCCL's sockets at the network interface that holds ``host`` (unless
    the user chose one): by default they bind wherever the machine's hostname resolves."""
    import psutil

    names = [name for name, addrs in psutil.net_if_addrs().items()
             if any(a.address.split("%")[0] == host for a in addrs)]
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if names and var not in os.environ:
            os.environ[var] = names[0]


def split_rows(n: int, parts: int) -> list[slice]:
    """``parts`` contiguous near-equal slices of ``range(n)`` (the workers' shares)."""
    return [slice(i * n // parts, (i + 1) * n // parts) for i in range(parts)]


class GlooDataParallel:
    """The learner's data-parallel hooks over a torch.distributed process group (gloo on CPU).

    Args:
        rank: This replica's rank.
        world: Number of replicas.
    """

    def __init__(self, rank: int, world: int, device: torch.device | None = None) -> None:
        self.rank, self.world = rank, world
        self.device = device or torch.device("cpu")  # NCCL reduces tensors on the GPU

    def local_rows(self, n: int) -> slice:
        """Contiguous, near-equal shares; the pool makes every mini-batch have >= world rows."""
        return split_rows(n, self.world)[self.rank]

    def sync_grads(self, params: list[nn.Parameter], finite: bool) -> bool:
        """Sums gradients over replicas with one all-reduce of a flat bucket plus a NaN flag."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.detach().reshape(-1).float().to(self.device) for g in grads]
                         + [torch.zeros(1, device=self.device)])
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
        values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64,
                              device=self.device)
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return {k: float(v) if is_share_metric(k) else float(v) / self.world
                for k, v in zip(keys, values.tolist())}

    def passes(self, params: list[nn.Parameter], count: int) -> int:
        """Forward/backward passes this replica runs for ``count`` micro-batches of its own:
        ``count`` (replicas communicate once per optimizer step, not per pass)."""
        return count


class ShardedDataParallel(GlooDataParallel):
    """Data-parallel hooks of a sharded pool (``resources.sharding: fsdp``,
    :mod:`agentrt.runtime.sharding`): FSDP reduce-scatters the sharded gradients in the
    backward pass, so :meth:`sync_grads` all-reduces only unsharded ones (a critic's) with the
    NaN flag; and since every pass of the trainer communicates, every worker runs as many passes
    as the busiest one (:meth:`passes`)."""

    def sync_grads(self, params: list[nn.Parameter], finite: bool) -> bool:
        plain = [p for p in params if not isinstance(p, DTensor)]
        if plain:
            return super().sync_grads(plain, finite)
        flag = torch.tensor([0.0 if finite else 1.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.SUM)
        return bool(flag[0] == 0.0)

    def passes(self, params: list[nn.Parameter], count: int) -> int:
        if not any(isinstance(p, DTensor) for p in params):
            return count
        most = torch.tensor([count], device=self.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most[0])


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
    """One replica: a shared model with a learner (:class:`~agentrt.runtime.learner.Learner`)
    per policy.

    Several policies in one worker are LoRA adapters on one base; frozen snapshots are adapters
    (LoRA) or CPU weights (full weights) on the same
    :class:`~agentrt.runtime.shared_model.SharedModel`.

    Args:
        policies: Policy configs (model.path set); two or more must all be LoRA on one base.
        seed: Seeds initialisation (policy ``i`` of a shared base uses ``seed + i``).
        total_steps: Steps the LR schedules span.
        threads: torch intra-op threads (None keeps torch's default).
        workdir: Where a preset model is built.
        keep_memory: Keep freed memory in the process (``runtime.keep_freed_memory``; a Ray
            actor's process sets it here, a local pool's is the controller's).
    """

    def __init__(self, policies: list[PolicyConfig], seed: int = 0, total_steps: int = 1000,
                 threads: int | None = None, workdir: str | None = None,
                 keep_memory: bool = False) -> None:
        keep_freed_memory(keep_memory)
        if threads:
            torch.set_num_threads(threads)
        ids = [p.id for p in policies]
        if len(set(ids)) < len(ids):
            raise ValueError(f"two policies with one name in one pool: {ids}")
        self.shared = SharedModel(policies[0], seed=seed, workdir=workdir)
        self.learners: dict[str, Learner] = {}
        for i, cfg in enumerate(policies):
            self.learners[cfg.id] = Learner(cfg, seed=seed + i, total_steps=total_steps,
                                            shared=self.shared)
        self.snapshots: dict[str, int] = {}  # snapshot name -> version of its source
        self.sft_state: dict[str, tuple[torch.optim.Optimizer, Any]] = {}
        self.dp: GlooDataParallel | None = None
        self._store_socket: socket.socket | None = None  # rank 0's, kept open for the store

    # ------------------------------------------------------------------ set-up
    def info(self) -> dict[str, Any]:
        """Process id (fault tests kill it), node, token ids and versions."""
        tok = self.shared.tokenizer
        return {"pid": os.getpid(), "host": socket.gethostname(),
                "pad_id": int(tok.pad_token_id), "eos_id": int(tok.eos_token_id),
                "versions": self.versions()}

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a port bound on that address alone, on which rank 0 will
        serve the process group's TCP store (torch's own store listens on every interface)."""
        import ray

        host = ray.util.get_node_ip_address()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._store_socket = socket.create_server((host, 0), family=family)
        return host, int(self._store_socket.getsockname()[1])

    def init_data_parallel(self, address: str, port: int, rank: int, world: int,
                           timeout_s: float = 300.0) -> None:
        """Joins the pool's process group (gloo on CPU, NCCL on GPU) and installs the
        learners' data-parallel hooks. Rank 0 serves the store on the socket
        :meth:`rendezvous_address` bound; every rank's collectives bind to the interface of
        its node's address (so a one-machine Ray on 127.0.0.1 opens nothing beyond loopback)."""
        import ray

        backend = "nccl" if self.shared.device.type == "cuda" else "gloo"
        bind_collectives_to(ray.util.get_node_ip_address())
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(address, port, world, rank == 0, timeout, wait_for_workers=False,
                              master_listen_fd=self._store_socket.fileno() if rank == 0
                              else None)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=timeout)
        sharded = self.shared.cfg.resources.sharding == "fsdp"
        hooks = ShardedDataParallel if sharded else GlooDataParallel
        self.dp = hooks(rank, world, self.shared.device)
        if sharded:  # the trainer's parameters are new tensors: new optimizers over them
            self.shared.shard()
            for eng in self.learners.values():
                eng.rebuild_optimizer()
        if rank:  # replicas sample their shares of the prompts from different streams
            torch.manual_seed(torch.initial_seed() + 1_000_003 * rank)
        for eng in self.learners.values():
            eng.set_data_parallel(self.dp)

    def versions(self) -> dict[str, int]:
        return {**{k: e.version for k, e in self.learners.items()}, **self.snapshots}

    def _learner(self, name: str | None) -> Learner:
        """The learner of policy ``name`` (the only one when None)."""
        if name is None:
            if len(self.learners) != 1:
                raise ValueError(f"this pool hosts {sorted(self.learners)}; name the adapter")
            name = next(iter(self.learners))
        if name in self.snapshots:
            raise ValueError(f"{name!r} is a frozen snapshot; train its source policy instead")
        if name not in self.learners:
            raise KeyError(f"no policy or snapshot {name!r} here; have "
                           f"{sorted(self.learners) + sorted(self.snapshots)}")
        return self.learners[name]

    # ------------------------------------------------------------------ rollout and training
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig | None = None,
                 adapter: str | None = None) -> list[Completion]:
        """Completions as policy or snapshot ``adapter`` (its source's sampling by default)."""
        if adapter in self.snapshots:
            source = self.learners[adapter.split("@")[0]]
            return self.shared.generate(prompts, sampling or source.cfg.rollout.sampling,
                                        adapter)
        return self._learner(adapter).generate(prompts, sampling)

    def generate_many(self, requests: list[tuple[list[list[int]], SamplingConfig | None, str]]
                      ) -> list[list[Completion]]:
        """:meth:`generate` of each ``(prompts, sampling, adapter)``, as one batch where the
        model serves them together (:meth:`SharedModel.generate_many`)."""
        resolved = []
        for prompts, sampling, adapter in requests:
            if adapter in self.snapshots:
                source = self.learners[adapter.split("@")[0]]
                resolved.append((prompts, sampling or source.cfg.rollout.sampling, adapter))
            else:
                learner = self._learner(adapter)
                resolved.append((prompts, sampling or learner.cfg.rollout.sampling,
                                 learner.policy_id))
        return self.shared.generate_many(resolved)

    def module_copy(self, name: str) -> ModuleCopy:
        """A second module with policy ``name``'s weights (an async rollout generates on it)."""
        return ModuleCopy(self.shared, self._learner(name).policy_id)

    def reconfigure(self, cfg: PolicyConfig) -> None:
        """A live change of policy ``cfg.id``'s sampling or learning rate
        (agentrt.controller.control)."""
        self._learner(cfg.id).reconfigure(cfg)

    def prepare(self, batch: TrainBatch, rows: slice, adapter: str | None = None) -> Prepared:
        """Old (and reference) log-probs and values of ``rows`` of the whole batch."""
        eng = self._learner(adapter)
        shard = batch.select(rows)
        metrics = eng.prepare(shard)
        return Prepared(shard.old_logprobs, shard.ref_logprobs, shard.values, metrics,
                        shard.num_tokens, eng.kl_coef)

    def update(self, batch: TrainBatch, adapter: str | None = None) -> dict[str, float]:
        """The learner's update on the whole batch (advantages filled); this replica's rows."""
        return self._learner(adapter).update(batch)

    def preference_step(self, examples: list[Any], pairs: str = "all",
                        adapter: str | None = None) -> dict[str, float]:
        """One preference step on ``examples``; missing reference log-probs are computed here
        first (the same on every replica)."""
        from agentrt.runtime.preference import fill_reference, make_batch

        eng = self._learner(adapter)
        missing = [ex for ex in examples if ex.ref_logps is None]
        if missing:
            fill_reference(eng, missing, reference=True)
        return eng.preference_update(make_batch(examples, eng.pad_id, pairs))

    def fill_reference(self, examples: list[Any], adapter: str | None = None) -> list[Any]:
        """``examples`` with their reference log-probs: the policy as it stands now."""
        from agentrt.runtime.preference import fill_reference

        fill_reference(self._learner(adapter), examples)
        return examples

    def preference_eval(self, examples: list[Any], adapter: str | None = None
                        ) -> dict[str, float]:
        from agentrt.runtime.preference import preference_eval

        return preference_eval(self._learner(adapter), examples)

    def sequence_logprobs(self, prompts: list[list[int]], responses: list[list[int]],
                          adapter: str | None = None) -> list[float]:
        """Summed log-prob of each response after its prompt under policy or snapshot
        ``adapter``, at its (source's) sampling temperature (:mod:`agentrt.runtime.scoring`)."""
        from agentrt.runtime.scoring import sequence_logprobs

        if adapter in self.snapshots:
            return sequence_logprobs(self.learners[adapter.split("@")[0]], prompts, responses,
                                     adapter)
        return sequence_logprobs(self._learner(adapter), prompts, responses)

    def sft_step(self, batch: TrainBatch, sft: SFTConfig, adapter: str | None = None
                 ) -> dict[str, float]:
        """One supervised step; the first call builds the SFT optimizer (constant LR after
        ``sft.warmup_steps``)."""
        eng = self._learner(adapter)
        if eng.policy_id not in self.sft_state:
            # fused like the RL optimizer (the loop cost 15 ms a step on one core); weight
            # decay stays torch's AdamW default, 0.01, as the SFT warm start always had
            opt = make_optimizer(eng.parameters(), eng.cfg.optim.model_copy(
                update={"weight_decay": 0.01}), lr=sft.lr)
            sched = make_scheduler(opt, eng.cfg.optim.model_copy(
                update={"warmup_steps": sft.warmup_steps, "schedule": "constant"}), sft.steps)
            self.sft_state[eng.policy_id] = (opt, sched)
        opt, sched = self.sft_state[eng.policy_id]
        metrics = eng.sft_update(batch, opt)
        sched.step()
        return self.dp.reduce_metrics(metrics) if self.dp is not None else metrics

    def end_sft(self, adapter: str | None = None) -> None:
        """Drops the SFT optimizer; RL starts from version 0 of the warm-started policy."""
        eng = self._learner(adapter)
        self.sft_state.pop(eng.policy_id, None)
        eng.end_warm_start()  # version 0; the reference and the critic read these weights

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, adapter: str, tag: str) -> str:
        """Freezes policy ``adapter`` as ``"<adapter>@<tag>"``: an adapter for LoRA policies,
        CPU weights for full-weight ones."""
        src = self._learner(adapter)
        name = f"{src.policy_id}@{tag}"
        self.shared.freeze(src.policy_id, name)
        self.snapshots[name] = src.version
        return name

    def drop_snapshot(self, name: str) -> None:
        """Frees a snapshot that left the league."""
        if name not in self.snapshots:
            raise KeyError(f"no snapshot {name!r} here; have {sorted(self.snapshots)}")
        self.shared.drop(name)
        del self.snapshots[name]

    def reset_to(self, adapter: str, snapshot: str) -> None:
        """Loads ``snapshot``'s weights into policy ``adapter`` (league exploiter reset); the
        optimizer keeps its state, the version goes on counting."""
        self._learner(adapter).load_trainable_state(self.shared.weights(snapshot))

    # ------------------------------------------------------------------ state
    def state_dict(self, full: bool = True) -> dict[str, Any]:
        """Learner states per policy, snapshot weights and this process's torch RNG (only the RNG
        when not ``full``: replicas hold the same weights, a checkpoint needs them once)."""
        if not full and self.shared.trainer is None:
            return {"rng": torch.get_rng_state()}
        policies = {k: e.state_dict() for k, e in self.learners.items()}  # sharded: collective
        if not full:
            return {"rng": torch.get_rng_state()}
        return {
            "policies": policies,
            "snapshots": {k: {"source": k.split("@")[0], "tag": k.split("@", 1)[1],
                              "version": v, "weights": self.shared.weights(k)}
                          for k, v in self.snapshots.items()},
            "rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any], rank: int = 0) -> None:
        """Restores ``state`` (snapshots not in it are dropped); ``state["rng"]`` may be one
        RNG state or a list (one per rank)."""
        for name in [n for n in self.snapshots if n not in state["snapshots"]]:
            self.drop_snapshot(name)
        for name, snap in state["snapshots"].items():
            if name not in self.snapshots:
                self.snapshot(snap["source"], snap["tag"])
            self.shared.load_weights(name, snap["weights"])
            self.shared.sync(name, int(snap["version"]))
            self.snapshots[name] = int(snap["version"])
        for name, eng_state in state["policies"].items():
            self.learners[name].load_state_dict(eng_state)
        rng = state.get("rng")
        if isinstance(rng, list):
            rng = rng[rank % len(rng)] if rng else None
        if rng is not None:
            torch.set_rng_state(rng)

    def trainable_state(self, adapter: str | None = None) -> dict[str, torch.Tensor]:
        if adapter in self.snapshots:
            return self.shared.weights(adapter)
        return self._learner(adapter).trainable_state()

    def held_bytes(self) -> dict[str, int]:
        """Bytes of trained parameters, gradients and optimizer state this worker holds (its
        shards where sharded), of the rollout module's separate copy of the weights, and the
        process's peak resident memory (``max_rss``)."""
        import resource

        from agentrt.runtime.sharding import held_bytes

        out = held_bytes(self.shared.train_model, [e.optimizer for e in self.learners.values()])
        own = {id(p) for p in self.shared.train_model.parameters()}  # a LoRA base is shared
        out["rollout_copy"] = sum(p.numel() * p.element_size()
                                  for p in self.shared.model.parameters() if id(p) not in own)
        out["max_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        return out

    def save_pretrained(self, folder: str, adapter: str | None = None) -> str:
        return str(self._learner(adapter).save_pretrained(folder))

    def close(self) -> None:
        """Stops the rollout engine (vLLM) of this worker."""
        self.shared.close()
