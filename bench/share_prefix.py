"""Prefix sharing in the update: one forward + backward with each GRPO group's prompt computed
once against the same rows packed unshared.

For llama-tiny and llama-small and three batches of 32 prompts (7 tokens) x 8 responses (2-6,
20-32 and 4-64 tokens), it times the policy's forward, token log-probs and backward over
``agentrt.runtime.packing.layout`` without prefixes (``unshared``), with them as the engine builds it
(``shared``: the cost model picks the segments) and by positions alone (``positions``: the
layout with attention's cost left out, hidden 0). Prints per layout its rows x width, the prompt tokens not computed, the
median CPU seconds of interleaved repetitions on one thread, the ratio to ``unshared``, and the
largest log-prob difference to ``unshared`` (fp32 rounding).

Run: ``.venv/bin/python bench/share_prefix.py [--reps 5] [--presets llama-tiny,llama-small]``
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from agentrt.runtime.packing import Forward, Layout, layout
from agentrt.policies.models import build_model, load_model
from agentrt.core.types import Trajectory, Turn, collate

BATCHES = {"2-6 tokens": (2, 6), "20-32 tokens": (20, 32), "4-64 tokens": (4, 64)}


def batch(lo: int, hi: int, seed: int = 0):
    rng = random.Random(seed)
    trajs = []
    for g in range(32):
        prompt = [1] + [rng.randrange(3, 250) for _ in range(6)]
        for k in range(8):
            n = rng.randint(lo, hi)
            trajs.append(Trajectory([Turn(prompt, [rng.randrange(3, 250) for _ in range(n)],
                                          [-1.0] * n, reward=float(k % 2))], group_id=str(g)))
    return collate(trajs, 0)


def step(model: torch.nn.Module, lay: Layout, loss_mask: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    logits = model(**lay.inputs(torch.device("cpu"))).logits.float()
    lp = Forward(logits, lay).logprobs()
    ((lp * loss_mask).sum() / loss_mask.sum()).backward()
    return lp.detach()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--presets", default="llama-tiny,llama-small")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for preset in args.presets.split(","):
        folder = build_model(Path(tempfile.mkdtemp(prefix="bench-share-")) / preset, preset,
                             seed=0)
        model, _ = load_model(folder)
        hidden = model.config.hidden_size
        for name, (lo, hi) in BATCHES.items():
            b = batch(lo, hi)
            prefix = b.loss_mask.argmax(-1)
            lays = {"unshared": layout(b.input_ids, b.attention_mask, True, 0),
                    "shared": layout(b.input_ids, b.attention_mask, True, 0, prefix, hidden),
                    "positions": layout(b.input_ids, b.attention_mask, True, 0, prefix)}
            lps = {k: step(model, lay, b.loss_mask) for k, lay in lays.items()}  # warm-up
            times: dict[str, list[float]] = {k: [] for k in lays}
            for _ in range(args.reps):
                for k, lay in lays.items():
                    t = time.process_time()
                    step(model, lay, b.loss_mask)
                    times[k].append(time.process_time() - t)
            base = statistics.median(times["unshared"])
            print(f"{preset}, responses {name}:")
            for k, lay in lays.items():
                med = statistics.median(times[k])
                diff = float(((lps[k] - lps["unshared"]) * b.attention_mask).abs().max())
                rows, width = lay.input_ids.shape
                print(f"  {k:9s} {rows:4d} x {width:3d} rows, {lay.shared:5d} prompt tokens "
                      f"shared, {med:.3f} CPU s, {base / med:.2f}x, max |log-prob diff| "
                      f"{diff:.1e}", flush=True)


if __name__ == "__main__":
    main()
