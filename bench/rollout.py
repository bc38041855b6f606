"""Rollout benchmark: the decode loops of the HF backend, and HF against vLLM, side by side.

``--decode``: the static decode loop (``rollout.decode: static``) against ``model.generate``
(``rollout.decode: hf``) over the same module, interleaved: for llama-tiny and llama-small, batch
64 and 256, 6 and 32 new tokens, fp32 and bf16 autocast, the tokens/s of both, their ratio (median
of the per-round ratios; "cpu": the same in tokens per CPU-second of this process, which other
load on the machine disturbs less), and rollout MFU against the fp32 or bf16 matmul peak measured
in the same run (bench/mfu.py's GEMM peak and FLOP count: linear layers + attention of the
generated tokens; prefill not counted). Prompts: 16 random tokens; T = 1, no top-k/top-p.

Without ``--decode``: for each model size (llama-tiny and llama-small by default) it builds the
model, starts the HF backend (a Learner: ``rollout.decode`` auto, the static loop on these
models) and a vLLM engine over the same weights, warms both up, then reports

* tokens/s (generated tokens per second of wall time) of both on
  (a) a uniform batch: 64 prompts of 32 tokens, 32 new tokens each, sampled at T = 1;
  (b) multi-turn episodes: 32 episodes x 3 turns, a shared 128-token system prompt, observations
      of 8-48 tokens and responses of 8-32 tokens, each turn's prompt extending the previous turn
      (prefix caching serves the shared part; HF recomputes it);
  and the vLLM/HF speed-up (the backends alternate, best of ``--repeats`` runs each);
* in-place weight sync (``sync_weights`` of the trainer's state dict, median of 5) against a
  reload from disk, as one would do without in-place sync: save the checkpoint and start a new
  engine on it (a) in this process, where vLLM is already imported and warm (best of 2), and
  (b) in a new process, as a separate vLLM server or vLLM's default multiprocess engine must;
  as ratios sync/reload (target <= 0.1);
* the mean |vLLM log-prob - trainer log-prob| of sampled tokens (T = 0.8).

Speed figures depend on what else runs on the machine: only the ratios of one run mean much.

Run:  .venv/bin/python bench/rollout.py                      (about 6-8 minutes on 2 cores)
      .venv/bin/python bench/rollout.py --sizes llama-tiny   (quick look)
      .venv/bin/python bench/rollout.py --decode             (about 8 minutes on 2 cores)
      .venv/bin/python bench/rollout.py --arch all [--rounds 7 --size tiny --dtype fp32]
          (every architecture against Llama, bench/rollout_arch.py; about 1 minute)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from agentrt.config.rollout import RolloutConfig, SamplingConfig, VLLMConfig
from agentrt.config.sections import ModelConfig, PolicyConfig
from agentrt.runtime.learner import Learner
from agentrt.policies.models import build_model
from agentrt.runtime.rollout.vllm_backend import VLLMRollout
from agentrt.core.types import Trajectory, Turn, collate
from rollout_arch import uniform_prompts  # bench/rollout_arch.py: --arch

VLLM_CFG = VLLMConfig(kv_cache_gib=0.5, max_model_len=1024, max_num_seqs=128)
DECODE_GRID = [(batch, new) for batch in (64, 256) for new in (6, 32)]


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - start, out


def rate(tokens: int, seconds: float) -> float:
    return tokens / seconds


def uniform_workload(generate, n: int = 64) -> tuple[int, float]:
    """(generated tokens, seconds) for one uniform batch."""
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=32)
    secs, comps = timed(generate, uniform_prompts(n, 32, seed=1), sampling)
    return sum(len(c.response_ids) for c in comps), secs


def multi_turn_workload(generate, episodes: int = 32, turns: int = 3) -> tuple[int, float]:
    """(generated tokens, seconds) for multi-turn episodes with a shared system prompt."""
    rng = random.Random(2)
    system = [1] + [rng.randrange(3, 259) for _ in range(127)]
    contexts = [list(system) for _ in range(episodes)]
    tokens, secs = 0, 0.0
    for _ in range(turns):
        for ctx in contexts:  # a variable-length observation from the environment
            ctx += [rng.randrange(3, 259) for _ in range(rng.randrange(8, 49))]
        limit = rng.randrange(8, 33)
        sampling = SamplingConfig(temperature=1.0, max_new_tokens=limit)
        dt, comps = timed(generate, contexts, sampling)
        secs += dt
        for ctx, comp in zip(contexts, comps):
            ctx += comp.response_ids
            tokens += len(comp.response_ids)
    return tokens, secs


RESTART = """
import sys, time
start = time.perf_counter()
from agentrt.config.rollout import VLLMConfig
from agentrt.runtime.rollout.vllm_backend import VLLMRollout
VLLMRollout(sys.argv[1], VLLMConfig.model_validate_json(sys.argv[2]))
print(time.perf_counter() - start)
"""


def sync_vs_reload(trainer: Learner, rollout: VLLMRollout, workdir: Path,
                   process_restart: bool) -> dict[str, float]:
    """Median in-place sync against reloads from disk (same process; optionally a new process)."""
    state = trainer.model.state_dict()
    rollout.sync_weights(state, trainer.version)  # warm-up
    sync = statistics.median(rollout.sync_weights(state, trainer.version) for _ in range(5))
    reloads = []
    for _ in range(2):
        start = time.perf_counter()
        folder = trainer.save_pretrained(workdir / "reload")
        VLLMRollout(folder, VLLM_CFG).close()
        reloads.append(time.perf_counter() - start)
    out = {"sync_s": sync, "reload_s": min(reloads), "ratio": sync / min(reloads)}
    if process_restart:  # what a separate vLLM server or multiprocess engine pays
        start = time.perf_counter()
        folder = trainer.save_pretrained(workdir / "reload")
        subprocess.run([sys.executable, "-c", RESTART, str(folder), VLLM_CFG.model_dump_json()],
                       check=True, capture_output=True)
        out["restart_s"] = time.perf_counter() - start
        out["ratio_restart"] = sync / out["restart_s"]
    shutil.rmtree(workdir / "reload", ignore_errors=True)
    return out


def logprob_gap(trainer: Learner, rollout: VLLMRollout) -> float:
    prompts = uniform_prompts(32, 24, seed=3)
    comps = rollout.generate(prompts, trainer.cfg.rollout.sampling, seeds=range(len(prompts)))
    batch = collate([Trajectory([Turn(p, c.response_ids, c.logprobs)])
                     for p, c in zip(prompts, comps)], trainer.pad_id)
    mask = batch.loss_mask.bool()
    return float((batch.old_logprobs - trainer.logprobs(batch))[mask].abs().mean())


def bench_size(preset: str, workdir: Path, process_restart: bool, repeats: int
               ) -> dict[str, float]:
    folder = build_model(workdir / preset, preset, seed=0)
    sampling = SamplingConfig(temperature=0.8, max_new_tokens=32)
    cfg = PolicyConfig(model=ModelConfig(path=str(folder)),
                       rollout=RolloutConfig(sampling=sampling, vllm=VLLM_CFG))
    trainer = Learner(cfg, seed=0)
    start = time.perf_counter()
    rollout = VLLMRollout(folder, VLLM_CFG)
    startup = time.perf_counter() - start
    try:
        warm = uniform_prompts(8, 16, seed=0)
        trainer.generate(warm, SamplingConfig(max_new_tokens=8))
        rollout.generate(warm, SamplingConfig(max_new_tokens=8))
        params = sum(p.numel() for p in trainer.model.parameters())
        row: dict[str, float] = {"params_M": params / 1e6, "vllm_start_s": startup}
        for name, workload in (("uniform", uniform_workload), ("multiturn", multi_turn_workload)):
            # Alternate the backends and keep each one's best run: other work on a shared
            # machine only ever slows a run down, so the best is the least disturbed.
            hf, vl = [], []
            for _ in range(repeats):
                hf.append(rate(*workload(trainer.generate)))
                rollout.reset_prefix_cache()  # no hits carried over from the previous repeat
                before = dict(rollout.stats)
                vl.append(rate(*workload(rollout.generate)))
            row[f"{name}_hf_tok_s"] = max(hf)
            row[f"{name}_vllm_tok_s"] = max(vl)
            row[f"{name}_speedup"] = max(vl) / max(hf)
            cached = rollout.stats["cached_prompt_tokens"] - before["cached_prompt_tokens"]
            row[f"{name}_prefix_hit"] = cached / (rollout.stats["prompt_tokens"]
                                                   - before["prompt_tokens"])
        row.update(sync_vs_reload(trainer, rollout, workdir, process_restart))
        row["logprob_mean_abs_diff"] = logprob_gap(trainer, rollout)
        return row
    finally:
        rollout.close()


def bench_decode(presets: list[str], workdir: Path, rounds: int) -> None:
    """Static decode loop vs model.generate, interleaved, with MFU against in-run GEMM peaks."""
    from mfu import forward_flops, gemm_peak  # bench/mfu.py: one FLOP count for every bench

    from agentrt.policies.models import load_model
    from agentrt.runtime.rollout.hf import HFRollout

    shapes = [(b, 256, 1024) for b, _ in DECODE_GRID] + [(256, 1024, 256), (256, 256, 768)]
    peaks = {"fp32": gemm_peak(torch.float32, shapes, 3), "bf16": gemm_peak(torch.bfloat16,
                                                                             shapes, 3)}
    print(f"threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}; matmul "
          f"peak fp32 {peaks['fp32']:.0f} GFLOP/s, bf16 {peaks['bf16']:.0f} GFLOP/s\n")
    print(f"{'model':12s}{'dtype':>6s}{'batch':>6s}{'new':>5s}{'hf tok/s':>10s}"
          f"{'static':>10s}{'ratio':>7s}{'cpu':>7s}{'MFU hf':>8s}{'static':>8s}")
    small_256: dict[str, float] = {}
    for preset in presets:
        model, tokenizer = load_model(build_model(workdir / preset, preset, seed=0))
        model.eval()
        for dtype in ("fp32", "bf16"):
            autocast = torch.bfloat16 if dtype == "bf16" else None
            arms = {mode: HFRollout(model, tokenizer, SamplingConfig(), batch_size=256,
                                    autocast_dtype=autocast, decode=mode)
                    for mode in ("hf", "static")}
            for arm in arms.values():  # warm-up
                arm.generate(uniform_prompts(8, 16, seed=0), SamplingConfig(max_new_tokens=4))
            for batch, new in DECODE_GRID:
                prompts = uniform_prompts(batch, 16, seed=batch + new)
                sampling = SamplingConfig(temperature=1.0, max_new_tokens=new)
                rates: dict[str, list[float]] = {m: [] for m in arms}
                cpu: dict[str, list[float]] = {m: [] for m in arms}  # tokens per CPU-second
                flops: dict[str, list[float]] = {m: [] for m in arms}
                cpu_flops: dict[str, list[float]] = {m: [] for m in arms}
                for _ in range(rounds):
                    for mode, arm in arms.items():
                        cpu_start = time.process_time()
                        secs, comps = timed(arm.generate, prompts, sampling)
                        cpu_secs = time.process_time() - cpu_start
                        pos = [len(p) + i for p, c in zip(prompts, comps)
                               for i in range(len(c.response_ids))]
                        rates[mode].append(len(pos) / secs)
                        cpu[mode].append(len(pos) / cpu_secs)
                        flops[mode].append(forward_flops(model, pos) / secs / 1e9)
                        cpu_flops[mode].append(forward_flops(model, pos) / cpu_secs / 1e9)
                ratio = statistics.median(s / h for s, h in zip(rates["static"], rates["hf"]))
                ratio_cpu = statistics.median(s / h for s, h in zip(cpu["static"], cpu["hf"]))
                mfu = {m: statistics.median(f) / peaks[dtype] for m, f in flops.items()}
                print(f"{preset:12s}{dtype:>6s}{batch:6d}{new:5d}"
                      f"{statistics.median(rates['hf']):10.0f}"
                      f"{statistics.median(rates['static']):10.0f}{ratio:7.2f}{ratio_cpu:7.2f}"
                      f"{mfu['hf']:8.0%}{mfu['static']:8.0%}", flush=True)
                if preset == "llama-small" and batch == 256 and new == 32:
                    small_256[dtype] = mfu["static"]
                    print(f"{'':12s}GFLOP per CPU-second of this process: generate "
                          f"{statistics.median(cpu_flops['hf']):.1f}, static "
                          f"{statistics.median(cpu_flops['static']):.1f}")
    if small_256:
        met = small_256.get("fp32", 0) >= 0.6 or small_256.get("bf16", 0) >= 0.4
        print(f"\nllama-small, batch 256, 32 new tokens, static decode: MFU "
              f"{small_256.get('fp32', 0):.0%} of the fp32 peak (target 60%), "
              f"{small_256.get('bf16', 0):.0%} of the bf16 peak with bf16 on (target 40%): "
              f"{'met' if met else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["llama-tiny", "llama-small"])
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs per backend and workload, alternating; the best is kept")
    parser.add_argument("--no-process-restart", action="store_true",
                        help="skip timing an engine restart in a new process (about 1 min each)")
    parser.add_argument("--decode", action="store_true",
                        help="the static decode loop against model.generate (no vLLM)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="--decode, --arch: interleaved rounds (the median is kept)")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--arch", help="all, or architectures (qwen2,gemma2): each one's "
                        "rollout tokens/s against Llama's at one size (bench/rollout_arch.py)")
    parser.add_argument("--size", default="tiny", help="--arch: the presets' size")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="--arch: policy.model.dtype")
    parser.add_argument("--json", help="--arch: also write every round and the machine here")
    parser.add_argument("--profile", action="store_true",
                        help="--arch: also count each one's aten calls in one workload")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    if args.arch:
        import rollout_arch

        return rollout_arch.main(args)
    workdir = Path(tempfile.mkdtemp(prefix="agentrt-bench-rollout-"))
    if args.decode:
        try:
            bench_decode(args.sizes, workdir, args.rounds)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return
    rows = {}
    try:
        for preset in args.sizes:
            rows[preset] = bench_size(preset, workdir, not args.no_process_restart,
                                      args.repeats)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nrollout benchmark (torch threads: {torch.get_num_threads()})")
    header = f"{'':28s}" + "".join(f"{p:>16s}" for p in rows)
    print(header)
    for key in next(iter(rows.values())):
        fmt = "{:>16.4f}" if key in ("ratio", "ratio_restart", "sync_s") else (
            "{:>16.2e}" if key == "logprob_mean_abs_diff" else "{:>16.2f}")
        print(f"{key:28s}" + "".join(fmt.format(r[key]) for r in rows.values()))
    for key, what in (("ratio", "reload in this process"), ("ratio_restart", "engine restart")):
        if key in next(iter(rows.values())):
            worst = max(r[key] for r in rows.values())
            print(f"sync / {what}, worst size: {worst:.4f} (target <= 0.1: "
                  f"{'met' if worst <= 0.1 else 'NOT met'})")


if __name__ == "__main__":
    main()
