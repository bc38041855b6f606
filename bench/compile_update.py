"""Does ``torch.compile`` (inductor, CPU) speed up the update's forward + backward?

The update's profile (docs/performance.md) is half GEMMs and ~40% element-wise ops of the
transformers Llama code (RMSNorm, rotary, SiLU gating and their backward), which inductor can
fuse into C++/OpenMP loops. Per model, one process: a training batch like the GRPO update's
(``--rows`` sequences of prompt + response lengths drawn from a seed, laid out by
agentrt.runtime.packing: packed rows with restarting position ids; ``padded``: right-padded rows with a
2D attention mask; ``mask4d``: the packed rows with an explicit block-diagonal causal boolean mask
[R, 1, W, W] plus position ids), then forward, token log-probs (agentrt's Forward), a
PPO-ratio scalar loss and backward, on copies of one model with the same weights: eager and
``torch.compile(model, dynamic=...)`` arms.

Prints per arm: the first call's seconds (compile), the graphs compiled after calls on
``--shapes`` batches of other seeds (so other packed row counts R and widths W: does a shape
change recompile?), the max abs difference of log-probs and gradients against eager (parity),
and the steady-state seconds (wall and CPU, median over ``--reps`` interleaved rounds, the
arms' order rotated) with the ratio eager / arm.

Run: ``.venv/bin/python bench/compile_update.py [--models llama-small,llama-tiny]
[--layouts packed,padded,mask4d] [--arms eager,static,dynamic] [--mode default]
[--rows 256] [--reps 5] [--shapes 3] [--threads 2]``
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from agentrt.runtime.packing import Forward, Layout, layout
from agentrt.policies.models import build_model
from agentrt.policies.models import load_model

# compile arms: name -> torch.compile's ``dynamic``
ARMS = {"static": False, "dynamic": True, "auto": None}


def batch(rows: int, seed: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded [rows, T] ids and mask (prompt 11-15 + response 8-32 tokens, ~37 per row as
    in the profiled update at 32 new tokens) and per-row advantages."""
    g = torch.Generator().manual_seed(seed)
    lengths = (torch.randint(11, 16, (rows,), generator=g)
               + torch.randint(8, 33, (rows,), generator=g))
    width = int(lengths.max())
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    ids = torch.randint(3, vocab, (rows, width), generator=g) * mask
    adv = torch.randn(rows, 1, generator=g)
    return ids, mask, adv


def block_causal(position_ids: torch.Tensor) -> torch.Tensor:
    """[R, 1, W, W] boolean mask (True: attend) confining causal attention to each packed
    sequence (position ids restart at every sequence)."""
    seq = (position_ids == 0).cumsum(-1)
    same = seq[:, :, None] == seq[:, None, :]
    causal = torch.ones(position_ids.shape[1], position_ids.shape[1], dtype=torch.bool).tril()
    return (same & causal)[:, None]


def inputs_of(ids: torch.Tensor, mask: torch.Tensor, kind: str) -> tuple[dict, Layout]:
    lay = layout(ids, mask, kind != "padded", pad_id=0)
    kw = lay.inputs(torch.device("cpu"))
    if kind == "mask4d":
        kw["attention_mask"] = block_causal(lay.position_ids)
    return kw, lay


def step(model: nn.Module, kw: dict, lay: Layout, mask: torch.Tensor, adv: torch.Tensor
         ) -> torch.Tensor:
    """Forward, token log-probs, a PPO-ratio loss and backward; returns the log-probs."""
    model.zero_grad(set_to_none=True)
    lp = Forward(model(**kw).logits.float(), lay).logprobs()
    m = mask.float()
    m[:, 0] = 0.0
    loss = -(torch.exp(lp - lp.detach()) * adv * m).sum() / m.sum()
    loss.backward()
    return lp.detach() * m


def graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])  # noqa: SLF001


def timed(fn) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def run_model(preset: str, a: argparse.Namespace, folder: Path) -> None:
    base, _ = load_model(build_model(folder / preset, preset, seed=0))
    base.eval()
    vocab = int(base.config.vocab_size)
    models = {"eager": base}
    for arm in a.arms:
        if arm != "eager":
            models[arm] = torch.compile(copy.deepcopy(base), dynamic=ARMS[arm],
                                        mode=None if a.mode == "default" else a.mode)
    for kind in a.layouts:
        torch._dynamo.reset()  # noqa: SLF001  (each layout compiles from scratch)
        ids, mask, adv = batch(a.rows, 0, vocab)
        kw, lay = inputs_of(ids, mask, kind)
        print(f"{preset} {kind}: {a.rows} rows, {lay.tokens} tokens in [{lay.input_ids.shape[0]}, "
              f"{lay.input_ids.shape[1]}], load {os.getloadavg()[0]:.1f}", flush=True)
        ref_lp = step(base, kw, lay, mask, adv)
        ref_grad = {n: p.grad.clone() for n, p in base.named_parameters()}
        scale = max(float(g.abs().max()) for g in ref_grad.values())
        for arm, model in models.items():
            if arm == "eager":
                continue
            before = graphs()
            wall, _, lp = timed(lambda: step(model, kw, lay, mask, adv))
            grads = dict(model.named_parameters())
            gdiff = max(float((grads[f"_orig_mod.{n}"].grad - g).abs().max())
                        for n, g in ref_grad.items())
            first = graphs() - before
            shapes = []
            for s in range(1, a.shapes + 1):  # other batches: other R and W
                ids2, mask2, adv2 = batch(a.rows, s, vocab)
                kw2, lay2 = inputs_of(ids2, mask2, kind)
                before2 = graphs()
                w2, _, _ = timed(lambda: step(model, kw2, lay2, mask2, adv2))
                shapes.append(f"[{lay2.input_ids.shape[0]},{lay2.input_ids.shape[1]}] "
                              f"+{graphs() - before2} graphs {w2:.1f}s")
            print(f"  {arm:8s} first call {wall:6.1f} s ({first} graphs); log-prob max diff "
                  f"{float((lp - ref_lp).abs().max()):.1e}, grad max diff {gdiff:.1e} (largest grad "
                  f"{scale:.1e}); "
                  f"other shapes: {'; '.join(shapes)}", flush=True)
        arms = list(models)
        fixed = steady(models, arms, a.reps, lambda rep: (kw, lay, mask, adv))
        report(fixed, arms, "steady")
        # the update's case: every step a new batch, so new R and W (static arms recompile)
        fresh_arms = [arm for arm in arms if arm == "eager" or ARMS[arm] is not False]

        def fresh(rep: int) -> tuple:
            ids2, mask2, adv2 = batch(a.rows, 100 + rep, vocab)
            return (*inputs_of(ids2, mask2, kind), mask2, adv2)

        report(steady(models, fresh_arms, a.reps, fresh), fresh_arms, "fresh shapes")


def steady(models: dict[str, nn.Module], arms: list[str], reps: int, work
           ) -> dict[str, dict[str, list[float]]]:
    """Seconds of each arm over ``reps`` rounds (``work(rep)``: the round's inputs), the arms'
    order rotated every round."""
    seconds = {arm: {"wall": [], "cpu": []} for arm in arms}
    for rep in range(reps):
        args = work(rep)
        for arm in arms[rep % len(arms):] + arms[:rep % len(arms)]:
            wall, cpu, _ = timed(lambda: step(models[arm], *args))
            seconds[arm]["wall"].append(wall)
            seconds[arm]["cpu"].append(cpu)
    return seconds


def report(seconds: dict[str, dict[str, list[float]]], arms: list[str], what: str) -> None:
    med = {arm: {k: statistics.median(v) for k, v in s.items()} for arm, s in seconds.items()}
    for arm in arms:
        print(f"  {arm:8s} {what}: {med[arm]['wall']:6.3f} s wall, {med[arm]['cpu']:6.3f} s CPU;"
              f" eager/{arm} {med['eager']['wall'] / med[arm]['wall']:.2f}x wall, "
              f"{med['eager']['cpu'] / med[arm]['cpu']:.2f}x CPU "
              f"(wall per rep {', '.join(f'{x:.2f}' for x in seconds[arm]['wall'])})",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama-small,llama-tiny")
    ap.add_argument("--layouts", default="packed,padded,mask4d")
    ap.add_argument("--arms", default="eager,static,dynamic")
    ap.add_argument("--mode", default="default",
                    help="torch.compile mode: default or max-autotune-no-cudagraphs")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shapes", type=int, default=3)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    a = ap.parse_args()
    a.layouts, a.arms = a.layouts.split(","), a.arms.split(",")
    if "eager" not in a.arms:
        a.arms.insert(0, "eager")
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, threads {a.threads}, mode {a.mode}, cpus "
          f"{os.cpu_count()}, load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        for preset in a.models.split(","):
            run_model(preset, a, Path(tmp))


if __name__ == "__main__":
    main()
