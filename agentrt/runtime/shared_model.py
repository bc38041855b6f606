"""One base model shared by every policy and frozen snapshot that runs on it.

A :class:`SharedModel` holds the base model (plain, or peft-wrapped with one named adapter per
LoRA policy), its tokenizer, and the rollout backend that serves it: HF ``generate`` over the
very module that trains, or one vLLM engine that serves every adapter of the base, routed per
request. It is the "model and weights" part of the hybrid engine; the learner of each policy
(:class:`~agentrt.runtime.learner.Learner`) trains through it and never touches the module's
adapters or the rollout directly.

Frozen snapshots (league opponents, the KL reference after a warm start):

- LoRA policies: a snapshot is one more adapter on the base (``"<policy>@<tag>"``): fifty past
  selves cost fifty adapters, not fifty models. vLLM serves it like any adapter.
- Full-weight policies: a snapshot is a CPU copy of the weights (one model's parameter bytes
  each, no module, no optimizer, no rollout). Generating with it swaps the tensors into the live
  module by pointer for the duration of the call (no copy) and restores them after; this runs on
  HF generate also when the policy's own rollout is vLLM. See docs/runtime.md for the costs.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from agentrt.runtime import attention
from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import PolicyConfig
from agentrt.core.device import resolve_device
from agentrt.core.errors import ConfigError
from agentrt.policies.models import build_model, load_model, lora_targets
from agentrt.runtime.rollout.hf import Completion, HFRollout
from agentrt.runtime.rollout.static import grouped_unsupported


def model_folder(cfg: PolicyConfig, workdir: str | Path | None, seed: int) -> Path:
    """The policy's model folder: ``model.path``, or a preset built once under ``workdir``."""
    if cfg.model.path is not None:
        return Path(cfg.model.path)
    base = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="agentrt-"))
    folder = base / f"base_model_{cfg.model.preset}"
    if not (folder / "config.json").is_file():
        build_model(folder, cfg.model.preset, seed=seed)
    return folder


def peft_config(cfg: PolicyConfig, model: nn.Module) -> Any:
    """peft's LoRA config of policy ``cfg`` on ``model`` (its architecture's default targets
    unless ``lora.target_modules`` names them; see :func:`agentrt.policies.models.lora_targets`)."""
    from peft import LoraConfig as PeftLoraConfig

    try:
        targets, fan_in_fan_out = lora_targets(model, cfg.lora.target_modules)
    except ConfigError as exc:
        raise ConfigError(f"policy {cfg.id!r}: {exc}") from None
    return PeftLoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                          target_modules=targets, fan_in_fan_out=fan_in_fan_out,
                          task_type="CAUSAL_LM")


@contextlib.contextmanager
def swapped_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> Iterator[None]:
    """Runs the block with ``weights`` in ``model`` by pointer (no copy), then puts them back."""
    live = model.state_dict(keep_vars=True)
    saved = {k: live[k].data for k in weights}
    try:
        for k, w in weights.items():
            live[k].data = w.to(live[k].device)  # a CPU snapshot crosses to the GPU per call
        yield
    finally:
        for k, data in saved.items():
            live[k].data = data


class SharedModel:
    """A base model, its tokenizer and rollout, hosting policies and snapshots by name.

    Args:
        cfg: The first policy's config (model, LoRA on/off, rollout backend).
        seed: Seeds the first adapter's initialisation and the vLLM engine.
        workdir: Where a preset model is built.
    """

    def __init__(self, cfg: PolicyConfig, seed: int = 0, workdir: str | Path | None = None
                 ) -> None:
        self.cfg = cfg
        self.path = model_folder(cfg, workdir, seed)
        self.device = resolve_device(cfg.model.device)
        self.autocast_dtype = torch.bfloat16 if cfg.model.dtype == "bf16" else None
        torch.manual_seed(seed)
        model, self.tokenizer = load_model(self.path)
        attention.apply(model, cfg.model.attention, self.device, self.autocast_dtype is not None)
        self.is_lora = cfg.lora.enabled
        if self.is_lora:
            from peft import get_peft_model

            model = get_peft_model(model, peft_config(cfg, model), adapter_name=cfg.id)
        self.model = model.to(self.device).eval()  # dropout off unless a learner asks for it
        self.hf = HFRollout(self.model, self.tokenizer, cfg.rollout.sampling,
                            cfg.rollout.batch_size, self.autocast_dtype, cfg.rollout.decode,
                            cfg.compile)
        self.adapters: dict[str, PolicyConfig] = {cfg.id: cfg}  # trainable policies
        self._active: str | None = cfg.id if self.is_lora else None  # peft's active adapter
        self.frozen: dict[str, dict[str, torch.Tensor]] = {}  # full-weight snapshots (CPU)
        self.frozen_adapters: dict[str, str] = {}  # LoRA snapshot -> its source policy
        # the static decoder can run the policy and its full-weight snapshots as one batch
        self._grouped = not self.is_lora and grouped_unsupported(self.model) is None
        # resources.sharding: the FSDP copy that trains (shard(); agentrt.runtime.sharding);
        # self.model then is the rollout module, the full weights gathered once per update
        self.trainer: nn.Module | None = None
        self.vllm: Any = None
        if cfg.rollout.backend == "vllm":
            from agentrt.runtime.rollout.vllm_backend import VLLMRollout

            self.vllm = VLLMRollout(self.path, cfg.rollout.vllm,
                                    dtype="bfloat16" if cfg.model.dtype == "bf16" else "float32",
                                    lora_rank=cfg.lora.r if self.is_lora else None, seed=seed,
                                    sampling=cfg.rollout.sampling,
                                    colocated=self.device.type == "cuda")

    @property
    def train_model(self) -> nn.Module:
        """The module gradients flow through: the sharded trainer, else the model itself."""
        return self.model if self.trainer is None else self.trainer

    def shard(self) -> None:
        """Shards the training state over the pool's process group (``resources.sharding:
        fsdp``): from now on the trainer trains and ``model`` serves the rollout and the
        no-grad passes, taking the trainer's weights at every :meth:`sync`."""
        from agentrt.runtime.sharding import shard

        self.trainer = shard(self.model, self.device, self.is_lora)
        if self.is_lora:
            self.activate(self._active or next(iter(self.adapters)), force=True)

    # ------------------------------------------------------------------ names
    def names(self) -> list[str]:
        return [*self.adapters, *self.frozen, *self.frozen_adapters]

    def add_policy(self, cfg: PolicyConfig, seed: int) -> None:
        """Another trainable LoRA policy on this base: a new named adapter."""
        if not (self.is_lora and cfg.lora.enabled):
            raise ValueError(f"policy {cfg.id!r}: several policies share a base only as LoRA "
                             "adapters (lora.enabled: true); give full-weight policies own pools")
        if cfg.id in self.names():
            raise ValueError(f"two policies named {cfg.id!r} on one base")
        torch.manual_seed(seed)
        self.model.add_adapter(cfg.id, peft_config(cfg, self.model))
        self.model.eval()  # peft builds the new adapter's modules (dropout) in training mode
        self.adapters[cfg.id] = cfg
        self._active = None  # the new adapter's flags: set on its next activation

    def activate(self, name: str, force: bool = False) -> None:
        """Makes ``name`` the adapter forward passes use (and the only one requiring grad).

        peft's ``set_adapter`` walks every module once per adapter (18.6 ms with 22 adapters on
        llama-tiny), so it is skipped when ``name`` is active already; ``force`` redoes it after
        something else changed the flags (adding or deleting an adapter)."""
        if not self.is_lora or name in self.frozen or (name == self._active and not force):
            return
        self.model.set_adapter(name)
        if self.trainer is not None and name in self.adapters:
            self.trainer.set_adapter(name)
        if name in self.frozen_adapters:
            self.model.requires_grad_(False)
        self._active = name

    def parameters(self, name: str) -> list[nn.Parameter]:
        """The parameters that training ``name`` changes."""
        self.activate(name)
        return [p for p in self.train_model.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def using(self, name: str | None) -> Iterator[nn.Module]:
        """The module computing as ``name`` (a policy or snapshot; None: the bare base model)."""
        if name is None:
            if not self.is_lora:
                raise ValueError("a full-weight model has no base without adapters")
            with self.model.disable_adapter():
                yield self.model
        elif name in self.frozen:
            with swapped_weights(self.model, self.frozen[name]):
                yield self.model
        else:
            self.activate(name)
            yield self.model

    # ------------------------------------------------------------------ weights
    def weights(self, name: str) -> dict[str, torch.Tensor]:
        """A detached copy of what training changes (the adapter alone for LoRA)."""
        if name in self.frozen:
            return {k: v.clone() for k, v in self.frozen[name].items()}
        if self.is_lora:
            from peft import get_peft_model_state_dict

            return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(
                self.model, adapter_name=name).items()}
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def load_weights(self, name: str, state: dict[str, torch.Tensor]) -> None:
        if name in self.frozen:
            self.frozen[name] = {k: v.detach().cpu().clone() for k, v in state.items()}
        elif self.is_lora:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, state, adapter_name=name)
        else:
            self.model.load_state_dict(state)
        if self.trainer is not None and name in self.adapters:
            from agentrt.runtime.sharding import scatter_from

            scatter_from(self.model, self.trainer)

    def freeze(self, source: str, name: str, serve: bool = True) -> None:
        """Freezes ``source``'s current weights as snapshot ``name`` (``serve``: also register it
        with the vLLM engine, for snapshots that play; a KL reference never generates)."""
        if name in self.names():
            raise ValueError(f"snapshot {name!r} exists; pick another tag")
        state = self.weights(source)
        if self.is_lora:
            self.model.add_adapter(name, peft_config(self.adapters[source], self.model))
            self.model.eval()  # peft builds its modules (dropout) in training mode
            self.frozen_adapters[name] = source
            self.load_weights(name, state)
            self.activate(source, force=True)  # add_adapter leaves the new one trainable
        else:
            self.frozen[name] = state
        if serve:
            self.sync(name, 0)

    def drop(self, name: str) -> None:
        """Frees a snapshot (its adapter, or its weights)."""
        if name in self.frozen:
            del self.frozen[name]
            return
        if name not in self.frozen_adapters:
            raise KeyError(f"{name!r} is not a snapshot here")
        self.activate(next(iter(self.adapters)), force=True)
        self.model.delete_adapter(name)
        del self.frozen_adapters[name]
        if self.vllm is not None and name in self.vllm.adapters:
            self.vllm.remove_adapter(name)

    def sync(self, name: str, version: int) -> float:
        """Pushes ``name``'s current weights into the vLLM engine (HF shares them already),
        after gathering them from a sharded trainer (every worker calls it); returns the
        seconds it took."""
        if self.trainer is not None and name in self.adapters:
            from agentrt.runtime.sharding import gather_into

            t0 = time.perf_counter()
            gather_into(self.trainer, self.model)
            return time.perf_counter() - t0
        if self.vllm is None or name in self.frozen:
            return 0.0
        if not self.is_lora:
            return float(self.vllm.sync_weights(self.model.state_dict(), version))
        cfg = self.adapters.get(name) or self.adapters[self.frozen_adapters[name]]
        t0 = time.perf_counter()
        state = self.weights(name)
        if name in self.vllm.adapters:
            self.vllm.update_adapter(name, state, version=version)
        else:
            self.vllm.add_adapter(name, state, peft_config(cfg, self.model), version)
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ rollout
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig | None, name: str
                 ) -> list[Completion]:
        """One completion per prompt as policy (or snapshot) ``name``."""
        if self.vllm is not None and name not in self.frozen:
            return self.vllm.generate(prompts, sampling, adapters=name if self.is_lora else None)
        with self.using(name):
            return self.hf.generate(prompts, sampling)

    def generate_many(self, requests: list[tuple[list[list[int]], SamplingConfig, str]]
                      ) -> list[list[Completion]]:
        """:meth:`generate` of each ``(prompts, sampling, name)``. With one sampling config on
        the HF rollout they run as one batch, every row as its own policy or snapshot
        (``HFRollout.generate(adapters=)``):

        - LoRA: a mixed-adapter batch, the base model computed once for all rows and no
          adapter switched between them;
        - full weights (the static decoder, :func:`grouped_unsupported`): the policy and its
          frozen snapshots' weights, each run of rows through its own.

        Anything else is one call per request."""
        sampling = requests[0][1] if requests else None
        names = {name for _, _, name in requests}
        if self.is_lora:
            joint = self.vllm is None and names <= {*self.adapters, *self.frozen_adapters}
        else:
            joint = (self._grouped and self.hf.decoder is not None
                     and names <= {*self.frozen, *(self.adapters if self.vllm is None else ())})
        if len(requests) < 2 or not joint or any(s != sampling for _, s, _ in requests):
            return [self.generate(p, s, n) if p else [] for p, s, n in requests]
        prompts = [p for ps, _, _ in requests for p in ps]
        out = self.hf.generate(prompts, sampling,
                               adapters=[name for ps, _, name in requests for _ in ps],
                               frozen=None if self.is_lora else
                               {n: self.frozen[n] for n in names if n in self.frozen})
        ends = list(itertools.accumulate(len(ps) for ps, _, _ in requests))
        return [out[end - len(ps):end] for end, (ps, _, _) in zip(ends, requests)]

    @contextlib.contextmanager
    def rollout_asleep(self) -> Iterator[None]:
        """The vLLM engine asleep inside the block (``rollout.vllm.sleep``: level 1, its KV
        cache dropped and its weights in host memory while an update runs), awake after it; a
        no-op without an engine that sleeps (HF rollout, CPU, sleep off)."""
        slept = self.vllm is not None and self.vllm.sleep()
        try:
            yield
        finally:
            if slept:
                self.vllm.wake_up()

    def close(self) -> None:
        if self.vllm is not None:
            self.vllm.close()
            self.vllm = None


class ModuleCopy:
    """A second module holding one policy's weights, in shared memory, for a rollout process that
    generates while the live module trains (``train.async_rollout``): the live module's weights
    change under an optimizer step, so an overlapping rollout needs weights of its own.

    Full weights: a deep copy (one more model). LoRA: only the policy's adapter is copied; the
    frozen base (and every other tensor training this policy leaves alone: buffers, the adapters
    of other policies and snapshots, which the copy never activates) is the learner's own tensor,
    moved to shared memory in place, so the copy costs one adapter, not one more base.

    Args:
        shared: The model that hosts the policy.
        name: The policy it copies (its adapter is the copy's active one).
    """

    def __init__(self, shared: SharedModel, name: str) -> None:
        self.shared, self.name = shared, name
        trainable = shared.parameters(name) if shared.is_lora else []
        with shared.using(name) as model:
            memo: dict[int, Any] = {}
            if shared.is_lora:  # deepcopy returns what the memo maps a tensor to: itself
                copied = {id(p) for p in trainable}
                memo = {id(t): t for t in (*model.parameters(), *model.buffers())
                        if id(t) not in copied}
            self.module = copy.deepcopy(model, memo).requires_grad_(False).eval().share_memory()
        self._pairs = [(p, memo[id(p)]) for p in trainable]  # (learner's, copy's) adapter tensors
        cfg = shared.adapters[name]
        self.tokenizer, self.batch_size = shared.tokenizer, cfg.rollout.batch_size
        self.autocast_dtype, self.decode = shared.autocast_dtype, cfg.rollout.decode

    def sync(self) -> None:
        """Copies the policy's current weights in place (the adapter alone for LoRA, the only
        tensors the copy owns): the process that reads the shared memory sees them at its next
        call."""
        if self.shared.is_lora:
            with torch.no_grad():
                for live, mine in self._pairs:
                    mine.copy_(live)
        else:
            self.module.load_state_dict(self.shared.model.state_dict())
