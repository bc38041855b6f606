"""Model FLOPs utilisation of rollout and update against a matmul peak measured in the same run.

Peak: the best GFLOP/s of fp32 and bf16 GEMMs of the sizes these models run (rows x hidden @ hidden
x intermediate, rows = the rollout batch and the update's tokens), with the same thread count,
through each GEMM torch has on a CPU: ``a @ b`` (MKL for fp32, which takes its AVX2 path on AMD
CPUs) and oneDNN's inner product over a weight packed once (twice MKL's fp32 rate on an AMD EPYC;
:mod:`agentrt.runtime.rollout.packed`). Rollout: one batched generate of ``--batch`` 2-digit addition
prompts (the agentrt HF rollout); the model FLOPs of the tokens it runs through the model (each
distinct prompt's tokens once, the prefill; then every generated token but the last, the next
step's input) per second; a token's FLOPs are 2 x the weights of every linear layer, lm_head
included, plus attention 4 x layers x width x the positions attended. Update: one GRPO update on
that batch (forward + backward = 3 x the forward FLOPs of its real tokens, padding not counted) per
second of the update. MFU = achieved / peak, printed against both peaks. Also the rate of one
decode step's matmuls alone at the rollout's rows (the model's weights, in the dtype its matmuls
run in): the most a decode loop could reach were attention, norms and sampling free.

Run: ``.venv/bin/python bench/mfu.py [--models llama-small,llama-tiny] [--batch 256]
[--tokens 32] [--threads 2] [--dtype fp32|bf16] [--compile] [--reps 3] [--profile]``
(``--compile``: ``policy.compile``, the update and the rollout's decode step through
torch.compile; their compiles happen in the warm-up calls).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from agentrt.runtime.rollout.packed import linear, pack


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def best_rate(run, flops: float, reps: int) -> float:
    """Best GFLOP/s of ``run()`` (``flops`` a call) over ``reps`` timings of about 2 GFLOP each,
    after one warm-up call."""
    inner = max(1, int(2e9 / flops))
    run()
    best = 0.0
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(inner):
            run()
        best = max(best, flops * inner / (time.perf_counter() - start) / 1e9)
    return best


def gemm_peak(dtype: torch.dtype, shapes: list[tuple[int, int, int]], reps: int
              ) -> tuple[float, str]:
    """Best GFLOP/s of ``m x k @ k x n`` over ``shapes`` and torch's CPU GEMMs (each warmed up,
    best of ``reps``), and the GEMM that reached it."""
    best = (0.0, "")
    for m, k, n in shapes:
        a, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
        packed = pack(w, m)
        runs = {"matmul": lambda: a @ w.T}
        if packed is not None:
            runs["oneDNN packed"] = lambda: linear(a, w, packed)
        for name, run in runs.items():
            best = max(best, (best_rate(run, 2 * m * k * n, reps), name))
    return best


def decode_gemm_rate(model: nn.Module, rows: int, reps: int, dtype: torch.dtype) -> float:
    """GFLOP/s of one decode step's linear layers alone, at ``rows`` rows (each weight's
    ``rows x in @ in x out`` in ``dtype``, the one the rollout's matmuls run in, timed back to
    back, best of ``reps`` and of ``F.linear`` and the packed oneDNN linear): the rate a decode
    step would reach if everything but its matmuls (attention over the cache, norms, sampling)
    were free."""
    ws = [m.weight.detach().to(dtype) for m in model.modules() if isinstance(m, nn.Linear)]
    xs = [torch.randn(rows, w.shape[1], dtype=w.dtype) for w in ws]
    packs = [pack(w, rows) for w in ws]
    with torch.inference_mode():
        return max(best_rate(lambda: [linear(x, w, p if packed else None)
                                      for x, w, p in zip(xs, ws, packs)],
                             2 * rows * linear_weights(model), reps)
                   for packed in (False, True))


def linear_weights(model: nn.Module) -> int:
    """Multiply-adds per token of every linear layer (lm_head included; embeddings are lookups)."""
    return sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))


def forward_flops(model: nn.Module, positions: list[int]) -> float:
    """Forward FLOPs of tokens at ``positions`` (0-based; the token at t attends t + 1 keys)."""
    c = model.config
    width = c.num_attention_heads * getattr(c, "head_dim", c.hidden_size // c.num_attention_heads)
    lin = 2 * linear_weights(model)
    return sum(lin + 4 * c.num_hidden_layers * width * (t + 1) for t in positions)


def rollout_positions(prompts: list[list[int]], comps: list) -> list[int]:
    """Positions of the tokens a generate call runs through the model: each distinct prompt's
    once (rows of one prompt share their prefill), then every generated token but the last."""
    return ([t for p in {tuple(p) for p in prompts} for t in range(len(p))]
            + [len(p) + i for p, c in zip(prompts, comps)
               for i in range(len(c.response_ids) - 1)])


def lengths_of(batch) -> list[int]:
    return batch.attention_mask.sum(-1).tolist()


def measure(preset: str, a: argparse.Namespace, folder: Path) -> dict[str, float]:
    from agentrt.algos.config import AlgorithmConfig
    from agentrt.config.rollout import SamplingConfig
    from agentrt.config.sections import ModelConfig, PolicyConfig
    from agentrt.algos.rae import RAEState
    from agentrt.runtime.learner import Learner
    from agentrt.runtime.steps import advantages_from
    from agentrt.policies.models import build_model
    from agentrt.envs.tasks import encode_prompt, make_splits
    from agentrt.core.types import Trajectory, Turn, collate

    path = build_model(folder / preset, preset, seed=0)
    cfg = PolicyConfig(model=ModelConfig(path=str(path), dtype=a.dtype),
                       rollout={"sampling": SamplingConfig(temperature=1.0,
                                                           max_new_tokens=a.tokens),
                                "batch_size": a.batch},
                       algorithm=AlgorithmConfig(name="grpo"), micro_batch_size=a.batch,
                       compile=a.compile)
    eng = Learner(cfg, seed=0)
    train, _ = make_splits("arithmetic", {"digits": 2, "ops": ["+"]}, a.batch, 8, 0)
    prompts = [encode_prompt(eng.tokenizer, ex.prompt) for ex in train[:a.batch]]
    eng.generate(prompts[:8])  # warm-up (and the decode step's compile)

    def grpo_batch(comps):  # groups of 8, rewards 0/1/2: the update's input, prepared
        batch = collate([Trajectory([Turn(p, c.response_ids, c.logprobs, reward=float(i % 3))],
                                    group_id=str(i // 8))
                         for i, (p, c) in enumerate(zip(prompts, comps))], eng.pad_id)
        eng.prepare(batch)
        advantages_from(batch, eng.algo, eng.kl_coef, RAEState.for_algorithm(eng.algo))
        return batch

    if a.compile:  # the update's compile and the full batch's shapes, outside the timings
        eng.update(grpo_batch(eng.generate(prompts)))
    gen, upd = [], []
    for rep in range(a.reps):
        start = time.perf_counter()
        comps = eng.generate(prompts)
        seconds = time.perf_counter() - start
        pos = rollout_positions(prompts, comps)
        flops = forward_flops(eng.model, pos)
        gen.append(flops / seconds)
        gen_tok = sum(len(c.response_ids) for c in comps) / seconds
        batch = grpo_batch(comps)
        start = time.perf_counter()
        if a.profile and rep == a.reps - 1:  # the op groups of one update (docs/performance.md)
            from torch.profiler import profile

            with profile() as prof:
                eng.update(batch)
            print(f"{preset} update, {a.dtype}, {sum(lengths_of(batch))} tokens:\n"
                  + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
        else:
            eng.update(batch)
        seconds = time.perf_counter() - start
        lengths = lengths_of(batch)
        upd.append(3 * forward_flops(eng.model, [t for n in lengths for t in range(n)]) / seconds)
        if rep == 0:
            per_token = flops / len(pos)
    return {"rollout_gflops": statistics.median(gen) / 1e9,
            "decode_gemm_gflops": decode_gemm_rate(eng.model, a.batch, a.reps, DTYPES[a.dtype]),
            "update_gflops": statistics.median(upd) / 1e9,
            "gen_tokens_per_s": gen_tok, "mflop_per_token": per_token / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama-small,llama-tiny")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--compile", action="store_true", help="policy.compile: true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true",
                    help="torch.profiler table of the last repetition's update (ops by self "
                    "time; that update's seconds then include the profiler's)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from agentrt.runtime.allocator import keep_freed_memory

    keep_freed_memory()  # as every agentrt run's controller does (runtime.keep_freed_memory)
    shapes = [(a.batch, 256, 1024), (a.batch, 1024, 256), (a.batch, 128, 512),
              (4096, 256, 1024), (4096, 1024, 256)]
    best = {"fp32": gemm_peak(torch.float32, shapes, a.reps),
            "bf16": gemm_peak(torch.bfloat16, shapes, a.reps)}
    peaks = {name: rate for name, (rate, _) in best.items()}
    print(f"cpus {os.cpu_count()}, threads {a.threads}, load average "
          f"{os.getloadavg()[0]:.1f}; matmul peak fp32 {peaks['fp32']:.0f} GFLOP/s "
          f"({best['fp32'][1]}), bf16 {peaks['bf16']:.0f} GFLOP/s ({best['bf16'][1]}); "
          f"model dtype {a.dtype}{', compiled' * a.compile}, "
          f"rollout batch {a.batch}, "
          f"{a.tokens} new tokens")
    with tempfile.TemporaryDirectory() as tmp:
        for preset in a.models.split(","):
            r = measure(preset, a, Path(tmp))
            for phase in ("rollout", "update"):
                got = r[f"{phase}_gflops"]
                print(f"  {preset:11s} {phase:7s} {got:6.1f} GFLOP/s: MFU "
                      f"{got / peaks['fp32']:.0%} of the fp32 peak, "
                      f"{got / peaks['bf16']:.0%} of the bf16 peak"
                      + (f" ({r['gen_tokens_per_s']:.0f} generated tokens/s, "
                         f"{r['mflop_per_token']:.1f} MFLOP per token)"
                         if phase == "rollout" else ""))
            ceiling = r["decode_gemm_gflops"]
            print(f"  {preset:11s} decode GEMMs alone at {a.batch} rows: {ceiling:6.1f} GFLOP/s "
                  f"({ceiling / peaks[a.dtype]:.0%} of the {a.dtype} peak); the rollout runs at "
                  f"{r['rollout_gflops'] / ceiling:.0%} of that")


if __name__ == "__main__":
    main()
