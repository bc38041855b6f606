"""Rollout tokens/s of every architecture at one size, relative to Llama's, side by side.

``bench/rollout.py --arch all`` (or ``--arch qwen2,gemma2``; ``--size``, ``--dtype``,
``--rounds``, ``--json``) lands here. For each architecture it builds the preset of the same size
(``<arch>-tiny`` by default), loads it the way a run does (a Learner with the HF backend,
``rollout.decode: auto``: the static decoder where the model's family has one, else
``model.generate`` with the reason the static decoder gives), and

* checks the timed path's greedy tokens (T = 0) against ``model.generate``'s over the same module
  (the static path only: on the fallback ``generate`` *is* the timed path), and prints the count;
* times the same uniform workload on every architecture, in interleaved rounds (llama, mistral,
  ..., then again): 64 prompts of 32 tokens, 32 new tokens each, sampled at T = 1, no
  top-k/top-p; the same batch, dtype and torch threads for all;
* reports per architecture the path, tokens/s (generated tokens per second of wall time; median
  of the rounds), tokens per CPU-second of this process (other load on the machine disturbs it
  less), and the ratio to Llama (median of the per-round ratios, wall and CPU), with the
  parameter counts: every preset of one size has the same width, depth, heads and vocabulary,
  but the layers differ (GPT-2/NeoX: no gate projection; Qwen2: q/k/v biases; Gemma: two more
  norms a layer and a tied head), so the counts differ a little;
* with ``--profile``, one more workload per architecture under the torch profiler: the aten
  calls it makes (the same on every run) and their own CPU time.

The goal (issue 37): within 1.3x of Llama on the static path for all but the named exceptions.
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from agentrt.config.rollout import RolloutConfig, SamplingConfig
from agentrt.config.sections import ModelConfig, PolicyConfig
from agentrt.policies.models import build_model
from agentrt.policies.presets import ARCHITECTURES
from agentrt.runtime.learner import Learner
from agentrt.runtime.rollout.hf import HFRollout
from agentrt.runtime.rollout.static import unsupported_reason

GOAL = 1.3  # slowest allowed tokens/s ratio llama/arch on the static path


def uniform_prompts(n: int, length: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``length`` random ids of the presets' tokenizer (BOS first)."""
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 259) for _ in range(length - 1)] for _ in range(n)]


def parse_archs(text: str) -> list[str]:
    """``all`` or a comma-separated list of ARCHITECTURES, with llama first (the reference)."""
    names = list(ARCHITECTURES) if text == "all" else [a.strip() for a in text.split(",") if a]
    unknown = [a for a in names if a not in ARCHITECTURES]
    if unknown:
        raise SystemExit(f"--arch: unknown architecture {', '.join(unknown)}; valid: all or "
                         f"{', '.join(ARCHITECTURES)}")
    return ["llama"] + [a for a in names if a != "llama"]


def load(arch: str, size: str, dtype: str, workdir: Path) -> dict[str, Any]:
    """The preset loaded as a run loads it, with its path, parameter counts and parity rows."""
    folder = build_model(workdir / f"{arch}-{size}", f"{arch}-{size}", seed=0)
    cfg = PolicyConfig(model=ModelConfig(path=str(folder), dtype=dtype),
                       rollout=RolloutConfig(decode="auto"))
    learner = Learner(cfg, seed=0)
    model = learner.model
    reason = unsupported_reason(model)
    embed = model.get_input_embeddings().weight
    params = {p.data_ptr(): p.numel() for p in model.parameters()}  # a tied head once
    out = {"arch": arch, "preset": f"{arch}-{size}", "class": type(model).__name__,
           "params": sum(params.values()), "params_non_embedding": sum(params.values())
           - embed.numel(), "path": "static" if reason is None else "generate",
           "reason": reason, "learner": learner}
    out["greedy_equal"], out["greedy_rows"] = parity(learner) if reason is None else (None, 0)
    return out


def parity(learner: Learner) -> tuple[int, int]:
    """(rows whose greedy tokens equal ``model.generate``'s, rows) on the timed path's workload
    shape, ``generate`` run over the same module with the same autocast."""
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=32)
    prompts = uniform_prompts(64, 32, seed=5)
    timed = learner.generate(prompts, greedy)
    generate = HFRollout(learner.model, learner.tokenizer, greedy, batch_size=256,
                         autocast_dtype=learner.shared.autocast_dtype, decode="hf")
    with torch.inference_mode():
        ref = generate.generate(prompts, greedy)
    return sum(a.response_ids == b.response_ids for a, b in zip(timed, ref)), len(prompts)


def one_run(learner: Learner, prompts: list[list[int]], sampling: SamplingConfig
            ) -> dict[str, float]:
    """Generated tokens, wall and CPU seconds of one workload."""
    cpu, wall = time.process_time(), time.perf_counter()
    comps = learner.generate(prompts, sampling)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tokens = sum(len(c.response_ids) for c in comps)
    return {"tokens": tokens, "wall_s": wall, "cpu_s": cpu, "tok_s": tokens / wall,
            "tok_cpu_s": tokens / cpu}


def op_counts(learner: Learner, prompts: list[list[int]], sampling: SamplingConfig
              ) -> dict[str, float]:
    """One workload under the torch profiler: aten calls made and their own CPU time (what the
    kernels cost, without the Python and dispatch around them)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        learner.generate(prompts, sampling)
    events = prof.key_averages()
    return {"aten_calls": sum(e.count for e in events),
            "kernel_cpu_ms": sum(e.self_cpu_time_total for e in events) / 1e3}


def bench_archs(archs: list[str], size: str = "tiny", dtype: str = "fp32", rounds: int = 5,
                workdir: Path | None = None, batch: int = 64, new_tokens: int = 32,
                profile: bool = False) -> dict[str, dict[str, Any]]:
    """Per architecture (llama first): path, reason, parameters, parity, every round's run, and
    the medians and ratios to Llama; with ``profile``, :func:`op_counts` after the rounds.
    ``workdir`` gets the built models."""
    import tempfile

    archs = ["llama"] + [a for a in archs if a != "llama"]
    workdir = Path(workdir or tempfile.mkdtemp(prefix="agentrt-bench-arch-"))
    rows = {a: load(a, size, dtype, workdir) for a in archs}
    prompts = uniform_prompts(batch, 32, seed=1)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=new_tokens)
    for row in rows.values():  # warm-up, then the rounds: every architecture once a round
        row["learner"].generate(prompts[:8], SamplingConfig(max_new_tokens=4))
        row["runs"] = []
    for _ in range(rounds):
        for row in rows.values():
            row["runs"].append(one_run(row["learner"], prompts, sampling))
    ref = rows["llama"]["runs"]
    for row in rows.values():
        learner = row.pop("learner")
        if profile:
            row.update(op_counts(learner, prompts, sampling))
        runs = row["runs"]
        row["tok_s"] = statistics.median(r["tok_s"] for r in runs)
        row["tok_cpu_s"] = statistics.median(r["tok_cpu_s"] for r in runs)
        row["ratio"] = statistics.median(r["tok_s"] / l["tok_s"] for r, l in zip(runs, ref))
        row["ratio_cpu"] = statistics.median(r["tok_cpu_s"] / l["tok_cpu_s"]
                                             for r, l in zip(runs, ref))
    return rows


def machine() -> dict[str, Any]:
    """Commit, platform, threads and load average now."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"),
            "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no")),
            "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "loadavg": os.getloadavg()}


def report(rows: dict[str, dict[str, Any]], settings: dict[str, Any]) -> None:
    """The table, every round's tokens/s, and the goal's verdict."""
    print(f"{'arch':10s}{'class':22s}{'params':>9s}{'non-emb':>9s}{'path':>10s}{'greedy=gen':>12s}"
          f"{'tok/s':>9s}{'tok/cpu-s':>11s}{'ratio':>7s}{'cpu':>6s}")
    for a, r in rows.items():
        parity = f"{r['greedy_equal']}/{r['greedy_rows']}" if r["greedy_rows"] else "-"
        print(f"{a:10s}{r['class']:22s}{r['params']:9d}{r['params_non_embedding']:9d}"
              f"{r['path']:>10s}{parity:>12s}{r['tok_s']:9.0f}{r['tok_cpu_s']:11.0f}"
              f"{r['ratio']:7.2f}{r['ratio_cpu']:6.2f}")
    print("\nevery round, tokens/s (wall):")
    for a, r in rows.items():
        print(f"  {a:10s}" + " ".join(f"{x['tok_s']:7.0f}" for x in r["runs"]))
    if "aten_calls" in rows["llama"]:
        print("\none workload under the torch profiler (aten calls, their own CPU ms):")
        for a, r in rows.items():
            print(f"  {a:10s}{r['aten_calls']:8d}{r['kernel_cpu_ms']:9.1f}")
    for a, r in rows.items():
        if r["reason"]:
            print(f"{a}: generate fallback: {r['reason']}")
    static = {a: r for a, r in rows.items() if r["path"] == "static" and a != "llama"}
    missed = [a for a, r in static.items() if r["ratio"] < 1 / GOAL]
    print(f"\ngoal: static-path architectures within {GOAL}x of llama's tokens/s "
          f"(ratio >= {1 / GOAL:.2f}): {'met' if not missed else 'NOT met by ' + ', '.join(missed)}"
          f" ({settings['size']}, {settings['dtype']}, batch {settings['batch']}, "
          f"{settings['new_tokens']} new tokens, {settings['rounds']} rounds)")


def main(args: Any) -> None:
    """Runs the bench for ``args`` (bench/rollout.py's --arch, --size, --dtype, --rounds,
    --profile, --json) and prints it; with --json, also writes every round and the machine there."""
    import json

    settings = {"archs": parse_archs(args.arch), "size": args.size, "dtype": args.dtype,
                "rounds": args.rounds, "batch": 64, "new_tokens": 32, "prompt_tokens": 32,
                "temperature": 1.0}
    started = machine()
    print(f"commit {started['commit'][:10]}, torch {started['torch']}, threads "
          f"{started['torch_threads']}, load average {started['loadavg'][0]:.2f} "
          f"{started['loadavg'][1]:.2f} {started['loadavg'][2]:.2f}\n", flush=True)
    rows = bench_archs(settings["archs"], args.size, args.dtype, args.rounds,
                       profile=args.profile)
    end = os.getloadavg()
    report(rows, settings)
    print(f"load average at the end {end[0]:.2f} {end[1]:.2f} {end[2]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"settings": settings, "machine": {**started, "loadavg_end": end}, "rows": rows},
            indent=1) + "\n")
