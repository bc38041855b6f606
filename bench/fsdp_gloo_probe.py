"""Probe: does torch FSDP2 (``fully_shard``) train agentrt's models on CPU with gloo?

Not the runtime's path (issue 37's sharded learner is not built yet, docs/runtime.md "Sharded
training"): this checks, on 2 gloo processes, the facts that learner must rest on, on a
llama-tiny preset with full weights and with LoRA:

- one FSDP unit per decoder layer plus the root trains; gradients summed, not averaged
  (``set_gradient_divide_factor(1.0)`` needs ``set_force_sum_reduction_for_comms(True)`` on
  gloo, whose reduce-scatter has no PREMUL_SUM);
- 3 steps of 2 ranks (each its half of the batch, loss divided by the whole batch's size) give
  the unsharded single process's weights;
- bytes of the local shards of params + grads + AdamW state per rank against unsharded;
- unshard once with ``reshard_after_forward`` off, then HF greedy generate equals the unsharded
  model's tokens. Every rank generates: a first version that generated on rank 0 alone hung
  (no output in 400 s), so FSDP's forward hooks still communicate, or wait, after an unshard;
  a rollout that runs on one worker alone needs a plain module with the gathered weights.

Run: ``.venv/bin/python bench/fsdp_gloo_probe.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS, WORLD = 3, 2


def build(folder: str, lora: bool) -> torch.nn.Module:
    from agentrt.policies.models import load_model

    torch.manual_seed(0)
    model, _ = load_model(folder)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                 task_type="CAUSAL_LM"), adapter_name="p")
    return model


def batch() -> torch.Tensor:
    return torch.randint(3, 100, (4, 12), generator=torch.Generator().manual_seed(1))


def nbytes(t: torch.Tensor | None) -> int:
    from torch.distributed.tensor import DTensor

    if t is None:
        return 0
    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()


def train(model: torch.nn.Module, rows: slice) -> tuple[list[torch.nn.Parameter], int]:
    """STEPS AdamW steps on ``rows`` of the batch; returns the trainable params and the bytes of
    params + grads + optimizer state held here."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    ids = batch()
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=ids[rows]).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[rows, 1:].reshape(-1), reduction="sum")
        (loss / ids[:, 1:].numel()).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    held = sum(nbytes(p) + nbytes(p.grad) for p in model.parameters())
    held += sum(nbytes(v) for s in opt.state.values() for v in s.values())
    return params, held


def rank_main(rank: int, folder: str, lora: bool, port: int, out: dict) -> None:
    from torch.distributed.fsdp import FSDPModule, fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    model = build(folder, lora)
    base = model.get_base_model() if lora else model
    for module in [m for m in model.modules() if type(m).__name__ in base._no_split_modules]:
        fully_shard(module)
    fully_shard(model)
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:  # sum the ranks' gradients (each loss is its share of the whole)
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    _, held = train(model, slice(rank * 2, rank * 2 + 2))
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}  # collective
    for unit in units:  # gathered once for the rollout: no collective per layer call
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    tokens = None
    if True:  # every rank: on rank 0 alone this hung (see the module docstring)
        with torch.no_grad():
            tokens = model.generate(input_ids=batch()[:1], max_new_tokens=6,
                                    do_sample=False).tolist()
    dist.barrier()
    out[rank] = {"held": held, "weights": full, "tokens": tokens}
    dist.destroy_process_group()


def main() -> None:
    from agentrt.policies.models import build_model

    folder = build_model(tempfile.mkdtemp() + "/tiny", "llama-tiny", seed=0)
    torch.set_num_threads(1)
    for lora in (False, True):
        ref = build(str(folder), lora)
        _, ref_held = train(ref, slice(0, 4))
        with torch.no_grad():
            ref_tokens = ref.generate(input_ids=batch()[:1], max_new_tokens=6,
                                      do_sample=False).tolist()
        ref_w = ref.state_dict()
        out = mp.Manager().dict()
        mp.spawn(rank_main, args=(str(folder), lora, 29530 + int(lora), out), nprocs=WORLD)
        diff = max(float((out[0]["weights"][k] - ref_w[k]).abs().max()) for k in ref_w)
        print(f"{'lora' if lora else 'full'}: {STEPS} steps, 2 FSDP ranks vs 1 unsharded: max "
              f"|weight diff| {diff:.2e}; params+grads+AdamW bytes per rank "
              f"{out[0]['held']}/{out[1]['held']} vs {ref_held} unsharded "
              f"({max(out[0]['held'], out[1]['held']) / ref_held:.3f}x); greedy tokens after "
              f"one unshard equal: {out[0]['tokens'] == ref_tokens}")
    sys.stdout.flush()


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    main()
