"""Sharded training (``resources.sharding: fsdp``): parameters, gradients and optimizer state
split over a pool's workers with torch FSDP2 (``fully_shard``), gloo on CPU and NCCL on GPUs.

A sharded worker holds two modules over one policy's weights (docs/runtime.md, "Sharded
training"):

- the *trainer*: a copy of the model with one FSDP unit per decoder layer plus the root. Each
  worker keeps 1/N of every trained tensor, of its gradient and of its AdamW state; a forward
  pass gathers a layer's weights just before it runs and frees them after, and the backward
  pass reduce-scatters the gradients (summed, not averaged: every worker's loss is its share of
  the whole mini-batch, as with the replicas' all-reduce). A LoRA policy's frozen base is not
  sharded: the trainer reads the rollout module's own base tensors, so only adapters are split.
- the *rollout module*: the plain model the rollout, the reference and every no-grad log-prob
  pass run on, with the full weights gathered from the trainer once per update (one all-gather
  per tensor, :func:`gather_into`), not once per layer call. Like a vLLM engine's copy it holds
  one model's weights, outside the trainer's sharded state.

Checkpoints stay in the unsharded format (full weights, optimizer state keyed by parameter
index with full tensors: :func:`full_optimizer_state`), so a checkpoint of N workers resumes
on any number, sharded or not (:func:`sharded_optimizer_state`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor



def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks (its ``_no_split_modules`` classes), one FSDP unit each."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"resources.sharding: {type(base).__name__} names no decoder layer "
                         "class (_no_split_modules) to shard by; set resources.sharding: none")
    return layers


def shard(model: nn.Module, device: torch.device, lora: bool) -> nn.Module:
    """The trainer: a copy of ``model`` sharded over the default process group.

    Args:
        model: The plain module (it stays unsharded: the rollout's).
        device: Where the shards live (the mesh's device type: gloo on "cpu", NCCL on "cuda").
        lora: Share the frozen base with ``model`` (not sharded) and shard the adapters only.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    frozen = [p for n, p in model.named_parameters() if lora and "lora_" not in n]
    memo: dict[int, Any] = {id(p): p for p in frozen}  # deepcopy keeps these very tensors
    trainer = copy.deepcopy(model, memo)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    ignored = set(frozen) or None
    for layer in decoder_layers(trainer):
        fully_shard(layer, mesh=mesh, ignored_params=ignored)
    fully_shard(trainer, mesh=mesh, ignored_params=ignored)
    for unit in (m for m in trainer.modules() if isinstance(m, FSDPModule)):
        unit.set_gradient_divide_factor(1.0)  # sum the workers' shares of the loss
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return trainer


@torch.no_grad()
def gather_into(trainer: nn.Module, plain: nn.Module) -> None:
    """Copies the trainer's sharded tensors, gathered in full, into ``plain`` (a collective:
    every worker calls it, in the same order)."""
    target = dict(plain.named_parameters())
    for name, p in trainer.named_parameters():
        if isinstance(p, DTensor):
            target[name].copy_(p.full_tensor())


@torch.no_grad()
def scatter_from(plain: nn.Module, trainer: nn.Module) -> None:
    """Sets every shard of the trainer to its part of ``plain``'s weights (no communication:
    each worker cuts its own part)."""
    source = dict(plain.named_parameters())
    for name, p in trainer.named_parameters():
        if isinstance(p, DTensor):
            p.to_local().copy_(_local_part(source[name], p))


def _local_part(full: torch.Tensor, like: DTensor) -> torch.Tensor:
    """This worker's part of ``full`` as sharded like ``like``."""
    part = distribute_tensor(full.to(like.device, like.dtype), like.device_mesh, like.placements,
                             src_data_rank=None)
    return part.to_local()


def full_optimizer_state(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """``opt.state_dict()`` with every sharded state tensor gathered in full (a collective where
    any is sharded; the unsharded format, loadable by any number of workers)."""
    state = opt.state_dict()
    state["state"] = {i: {k: v.full_tensor() if isinstance(v, DTensor) else v
                          for k, v in s.items()} for i, s in state["state"].items()}
    return state


def sharded_optimizer_state(opt: torch.optim.Optimizer, state: dict[str, Any]
                            ) -> dict[str, Any]:
    """A full (unsharded) optimizer ``state`` cut to this worker's shards of ``opt``'s
    parameters, ready for ``opt.load_state_dict`` (unchanged where nothing is sharded)."""
    params = [p for group in opt.param_groups for p in group["params"]]
    if not any(isinstance(p, DTensor) for p in params):
        return state
    out = dict(state)
    out["state"] = {}
    for i, s in state["state"].items():
        p = params[int(i)]
        out["state"][i] = {
            k: DTensor.from_local(_local_part(v, p), p.device_mesh, p.placements,
                                  shape=p.shape, stride=p.stride(), run_check=False)
            if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and v.shape == p.shape
            else v for k, v in s.items()}
    return out


def held_bytes(module: nn.Module, optimizers: list[torch.optim.Optimizer]) -> dict[str, int]:
    """Bytes this worker holds of ``module``'s trained parameters, their gradients and the
    optimizers' state (local shards where sharded; frozen tensors not counted)."""
    def size(t: torch.Tensor | None) -> int:
        if t is None:
            return 0
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    trained = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    params = [p for p in module.parameters() if id(p) in trained]
    return {"params": sum(size(p) for p in params), "grads": sum(size(p.grad) for p in params),
            "optimizer": sum(size(v) for opt in optimizers for s in opt.state.values()
                             for v in s.values() if isinstance(v, torch.Tensor))}
