"""GRPO on the same work with agentrt and with TRL's GRPOTrainer, side by side.

Both sides load one saved model folder and tokenizer (agentrt.policies.build_model), train on
2-digit addition prompts (bos + "a+b=", the same token ids) with the exact-match reward, fp32
(``--precision bf16``: both bf16 autocast over fp32 weights), KL off (beta 0), one optimizer
step per batch of 32 prompts x 8 completions, AdamW at a constant 1e-4, clip 1.0, token-mean
loss (TRL: dapo), group-std advantages with the same epsilon (1e-4).

First a parity check on one fixed batch (sampled by agentrt, a few completions replaced by the
right answer so the rewards vary): the log-probs of both trainers, the advantages, the loss and
the gradient norm at the same weights must agree within the precision's tolerances, and both
sides' matmuls must run in that precision (a forward hook reads their dtype), or the script
stops (with the ratio at 1 the loss alone depends only on advantages and lengths; the log-probs
and gradient test the rest). Then, per model and response length, each side runs warm-up and
timed steps in a fresh process; arms alternate within each repetition. Prints per side steps/s,
rollout tokens/s, trainer samples/s (samples / (prepare + update) seconds), peak RSS, the phase
breakdown per step (generate, prepare, update, other; TRL also the dtype its matmuls ran in per
phase) and the agentrt/TRL ratio of steps per second (median over repetitions), and the same
ratio per CPU second of the process (TRL's CPU seconds per step / agentrt's: steadier than wall
time on a loaded machine).

Run: ``.venv/bin/python bench/vs_trl.py [--models llama-tiny,llama-small] [--tokens 6,32]
[--reps 3] [--steps 20] [--warmup 3] [--threads 2] [--backend hf|vllm] [--precision fp32|bf16]
[--compile] [--trl-attention sdpa,eager] [--set KEY=VALUE] [--base-set KEY=VALUE]``.
``--compile``: agentrt with ``policy.compile`` against two TRL arms, eager and
``torch_compile=True`` (TRL compiles the model its generate runs too), and against the faster of
them per repetition (TRL-best). ``--trl-attention``: a TRL arm (two with ``--compile``) per
transformers attention implementation, all in TRL-best. ``--set``: agentrt overrides;
``--base-set`` adds an arm agentrt-base with more (before/after in one run). Needs the bench
extra: ``pip install -e .[bench]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS, GROUP, LR, EPS, SEED = 32, 8, 1e-4, 1e-4, 0
# fp32 on both sides, different kernels. grad_norm is relative, grad_direction the distance of
# the unit gradients: the advantages cancel within each group, so the gradient is a small
# difference of large terms and carries fp32 rounding of the whole backward (measured up to 6e-4
# on llama-small at 32 tokens); a wrong scale or sign moves these by 1e-2 or more.
# bf16 (--precision bf16): autocast on both sides over the same fp32 weights. Log-probs differ
# by up to 8e-3 (agentrt's matmul attention against TRL's SDPA; each is ~8e-3 from fp32); the
# gradient carries bf16 rounding of the whole backward: norm 1e-4 / 8e-4 relative, direction
# 3.9e-3 / 4.5e-3 (llama-tiny / llama-small, 32 tokens), so 2e-2 leaves 4x; a wrong sign moves
# the direction by 1 or more, a dropped term of the loss by 1e-1 or more.
TOL = {"fp32": {"logprobs": 2e-4, "advantages": 1e-5, "loss": 1e-5, "grad_norm": 2e-3,
                "grad_direction": 2e-3},
       "bf16": {"logprobs": 2e-2, "advantages": 1e-5, "loss": 1e-5, "grad_norm": 2e-2,
                "grad_direction": 2e-2}}


def examples(n: int, seed: int) -> list:
    """The arithmetic task's training examples (2-digit addition), as agentrt draws them."""
    from agentrt.workloads.prompts.config import TaskConfig
    from agentrt.workloads.prompts.data import open_source

    return open_source(TaskConfig.model_validate(task_config(n)), seed).next(n)


def task_config(n: int) -> dict:
    return {"name": "arithmetic", "train_size": max(n, 256), "eval_size": 8, "options": {
        "digits": 2, "ops": ["+"]}}


def matmul_dtypes(model, phase) -> dict[str, set[str]]:
    """Output dtypes of the first decoder layer's down projection per ``phase()`` (a function
    naming the current phase): what the side's matmuls really run in (autocast or not)."""
    seen: dict[str, set[str]] = {}
    proj = model.get_decoder().layers[0].mlp.down_proj
    proj.register_forward_hook(
        lambda m, i, out: seen.setdefault(phase(), set()).add(str(out.dtype).split(".")[-1]))
    return seen


def peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024.0


# ---------------------------------------------------------------------------------- agentrt arm
def agentrt_config(model_dir: str, tokens: int, steps: int, run_dir: str, threads: int,
                   backend: str, overrides: list[str], precision: str = "fp32"):
    import yaml

    from agentrt.config.load import load_config
    from agentrt.workloads.prompts.config import TrainConfig

    raw = {
        "seed": SEED, "run_dir": run_dir, "progress": False, "threads": threads,
        "task": task_config(20000), "reward": "exact_match",
        "policy": {"id": "p", "model": {"path": model_dir, "dtype": precision},
                   "rollout": {"backend": backend,
                               "sampling": {"temperature": 1.0, "max_new_tokens": tokens}},
                   "optim": {"lr": LR, "max_grad_norm": 1.0},
                   "algorithm": {"name": "grpo", "kl": {"coef": 0.0}, "eps": EPS},
                   "micro_batch_size": PROMPTS * GROUP},
        "sft": {"steps": 0}, "train": {"steps": steps, "prompts_per_step": PROMPTS,
                                       "group_size": GROUP},
        "eval": {"every": 100000}, "checkpoint": {"every": 100000},
    }
    path = Path(tempfile.mkdtemp()) / "vs_trl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path, overrides, TrainConfig)


def run_agentrt(a: argparse.Namespace) -> dict:
    from agentrt.controller.run_dir import RunDir
    from agentrt.workloads.prompts.workload import Trainer

    # The process's CPU seconds at each metrics row (one per step): on a loaded machine CPU time
    # per step is steadier than wall time. Instrumentation only; the row is written unchanged.
    cpu: list[float] = []
    write = RunDir.log_metrics

    def log_metrics(self, step: int, metrics: dict) -> None:
        cpu.append(time.process_time())
        write(self, step, metrics)

    RunDir.log_metrics = log_metrics
    total = a.warmup + a.steps + 1  # the last step also evaluates and saves: not timed
    with tempfile.TemporaryDirectory() as tmp:
        cfg = agentrt_config(a.model_dir, a.tokens, total, tmp, a.threads, a.backend, a.set,
                             a.precision)
        trainer = Trainer(cfg)
        trainer.run()
        rows = [json.loads(line) for line in
                (trainer.run_dir.path / "metrics.jsonl").read_text().splitlines()]
    steps = []
    for i in range(a.warmup + 1, total):
        row = rows[i]
        gen, prep, upd = (row.get(k, 0.0) for k in
                          ("timing_s/rollout", "timing_s/prepare", "timing_s/update"))
        steps.append({"wall": row["time"] - rows[i - 1]["time"], "cpu": cpu[i] - cpu[i - 1],
                      "generate": gen, "prepare": prep, "update": upd,
                      "tokens": row["rollout/response_length"] * PROMPTS * GROUP})
    return summarize(steps)


# ---------------------------------------------------------------------------------- TRL arm
def trl_args(out: str, tokens: int, steps: int, vllm: bool, precision: str = "fp32",
             compile: bool = False):
    from trl import GRPOConfig

    extra = ({"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3,
              "vllm_max_model_length": 128} if vllm else {})
    return GRPOConfig(
        output_dir=out, per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
        gradient_accumulation_steps=1, max_completion_length=tokens, temperature=1.0,
        top_p=1.0, top_k=0, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=1.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        weight_decay=0.0, beta=0.0, num_iterations=1, epsilon=0.2, loss_type="dapo",
        scale_rewards="group", max_steps=steps, logging_steps=1, report_to=[],
        save_strategy="no", seed=SEED, use_cpu=True, bf16=precision == "bf16", fp16=False,
        dataloader_num_workers=0, disable_tqdm=True, torch_compile=compile,
        # TRL turns gradient checkpointing on by default; it saves memory at the cost of a
        # second forward pass, and these models fit without it: its fastest fair setting is off
        gradient_checkpointing=False, **extra)


def exact_match_reward(completions: list[str], answer: list[str], **_: object) -> list[float]:
    """agentrt's exact_match, in TRL's reward-function contract."""
    from agentrt.rewards import exact_match

    return [exact_match("", c, {"answer": a}) for c, a in zip(completions, answer)]


def trl_dataset(tokenizer, n: int):
    from datasets import Dataset

    exs = examples(n, SEED)
    # TRL tokenizes the text with add_special_tokens; our tokenizer adds none, so the bos goes
    # in as text: the ids are agentrt's encode_prompt (bos + prompt).
    return Dataset.from_list([{"prompt": tokenizer.bos_token + ex.prompt, "answer": ex.answer}
                              for ex in exs])


def timed_trainer(cls):
    """GRPOTrainer that records each step's phases (generate, prepare, update) and wall."""
    from transformers import TrainerCallback

    class Timed(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.phases: list[dict] = []
            self.phase = "update"
            self.dtypes = matmul_dtypes(self.model, lambda: self.phase)
            self._cur = {"generate": 0.0, "prepare": 0.0, "tokens": 0}
            self._t_inputs = self._t_end = time.perf_counter()
            self._cpu_end = time.process_time()
            owner = self

            class Clock(TrainerCallback):
                def on_step_end(self, args, state, control, **kw):
                    now, cpu = time.perf_counter(), time.process_time()
                    owner.phases.append(owner._cur | {"update": now - owner._t_inputs,
                                                      "wall": now - owner._t_end,
                                                      "cpu": cpu - owner._cpu_end})
                    owner._cur = {"generate": 0.0, "prepare": 0.0, "tokens": 0}
                    owner._t_end, owner._cpu_end = now, cpu

            self.add_callback(Clock())

        def _generate(self, prompts):
            t = time.perf_counter()
            self.phase = "generate"
            try:
                out = super()._generate(prompts)
            finally:
                self.phase = "update"
            self._cur["generate"] += time.perf_counter() - t
            self._cur["tokens"] += sum(len(c) for c in out[1])
            return out

        def _prepare_inputs(self, batch):
            t, gen = time.perf_counter(), self._cur["generate"]
            out = super()._prepare_inputs(batch)
            self._t_inputs = time.perf_counter()
            self._cur["prepare"] += self._t_inputs - t - (self._cur["generate"] - gen)
            return out

    return Timed


def run_trl(a: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    total = a.warmup + a.steps + 1
    tok = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype="float32",
                                                 attn_implementation=a.attention)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = timed_trainer(GRPOTrainer)(
            model=model, reward_funcs=exact_match_reward, processing_class=tok,
            args=trl_args(tmp, a.tokens, total, a.backend == "vllm", a.precision, a.compile),
            train_dataset=trl_dataset(tok, 20000))
        trainer.train()
    return summarize(trainer.phases[a.warmup:a.warmup + a.steps]) | {
        "dtypes": {k: sorted(v) for k, v in trainer.dtypes.items()}}


def summarize(steps: list[dict]) -> dict:
    n = len(steps)
    tot = {k: sum(s[k] for s in steps) for k in ("wall", "cpu", "generate", "prepare",
                                                  "update", "tokens")}
    return {"steps": n, "steps_per_s": n / tot["wall"], "cpu_s_per_step": tot["cpu"] / n,
            "rollout_tokens_per_s": tot["tokens"] / max(tot["generate"], 1e-9),
            "trainer_samples_per_s": n * PROMPTS * GROUP / max(tot["prepare"] + tot["update"],
                                                                 1e-9),
            "peak_rss_mb": peak_rss_mb(), "response_tokens_per_step": tot["tokens"] / n,
            "phase_s": {k: tot[k] / n for k in ("generate", "prepare", "update")}
            | {"other": (tot["wall"] - tot["generate"] - tot["prepare"] - tot["update"]) / n}}


# ---------------------------------------------------------------------------------- driver
def worker(arm: str, model_dir: Path, tokens: int, a: argparse.Namespace,
           overrides: list[str], backend: str | None = None, compiled: bool = False,
           attention: str = "sdpa") -> dict:
    cmd = [sys.executable, __file__, "--worker", arm, "--model-dir", str(model_dir),
           "--tokens", str(tokens), "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--threads", str(a.threads), "--backend", backend or a.backend,
           "--precision", a.precision, "--attention", attention] + ["--compile"] * compiled
    for s in overrides:
        cmd += ["--set", s]
    env = os.environ | {"OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false",
                        "TRANSFORMERS_VERBOSITY": "error", "TRL_EXPERIMENTAL_SILENCE": "1",
                        "PYTHONWARNINGS": "ignore", "VLLM_CPU_KVCACHE_SPACE": "1"}
    if arm == "trl" and a.trl_keep_memory:  # agentrt's runtime.keep_freed_memory, as env
        env |= {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "2147483647"}
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if out.returncode:
        raise RuntimeError(f"{arm} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def show(name: str, runs: list[dict]) -> None:
    med = lambda k: statistics.median(r[k] for r in runs)  # noqa: E731
    ph = {k: statistics.median(r["phase_s"][k] for r in runs) for k in runs[0]["phase_s"]}
    print(f"  {name:12s} {med('steps_per_s'):6.3f} steps/s ({med('cpu_s_per_step'):5.2f} CPU "
          f"s/step) {med('rollout_tokens_per_s'):7.0f} "
          f"rollout tok/s {med('trainer_samples_per_s'):6.1f} trainer samples/s  peak RSS "
          f"{max(r['peak_rss_mb'] for r in runs):5.0f} MB | per step "
          + ", ".join(f"{k} {v:.3f}" for k, v in ph.items()) + " s"
          + (f"; matmuls in {runs[0]['dtypes']}" if "dtypes" in runs[0] else ""))


class UpdateCost:
    """The update's model FLOPs and the machine's GEMM peak for one model (bench/mfu.py's
    counting): forward + backward = 3 x the forward FLOPs of a step's real tokens (256
    sequences of the mean prompt length plus the arm's mean response length; padding not
    counted); the peak is the best GEMM rate at the update's shapes in the run's precision,
    measured here with the arms' thread count."""

    def __init__(self, model_dir: Path, precision: str, reps: int = 3) -> None:
        import torch
        from transformers import AutoConfig

        from mfu import gemm_peak  # bench/ is the script's folder

        c = AutoConfig.from_pretrained(model_dir)
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        kv = c.num_key_value_heads * head_dim
        self.linear = (c.hidden_size * (c.num_attention_heads * head_dim + 2 * kv)
                       + c.num_attention_heads * head_dim * c.hidden_size
                       + 3 * c.hidden_size * c.intermediate_size) * c.num_hidden_layers \
            + c.hidden_size * c.vocab_size  # multiply-adds per token, lm_head included
        self.attention = 4 * c.num_hidden_layers * c.num_attention_heads * head_dim
        self.prompt = statistics.mean(len(ex.prompt) + 1 for ex in examples(PROMPTS * 8, SEED))
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        rows = 4096  # an update's micro-batch of packed tokens
        self.peak, self.gemm = gemm_peak(dtype, [(rows, c.hidden_size, c.intermediate_size),
                                                 (rows, c.intermediate_size, c.hidden_size)],
                                         reps)
        self.precision = precision

    def flops(self, response_tokens_per_step: float) -> float:
        """Forward + backward FLOPs of one step's update."""
        length = self.prompt + response_tokens_per_step / (PROMPTS * GROUP)
        per_seq = length * 2 * self.linear + self.attention * length * (length + 1) / 2
        return 3 * PROMPTS * GROUP * per_seq

    def mfu(self, run: dict) -> float:
        """The update's achieved GFLOP/s over the peak."""
        rate = self.flops(run["response_tokens_per_step"]) / run["phase_s"]["update"] / 1e9
        return rate / self.peak


def parity(preset: str, model_dir: Path, tokens: int, a: argparse.Namespace) -> None:
    par = worker("parity", model_dir, tokens, a, a.set)
    print(f"{preset} parity: max |diff| log-probs {par['logprobs']:.2e} (mean log-prob "
          f"{par['mean_logprob']:.3f}), advantages {par['advantages']:.2e}, loss "
          f"{par['loss']:.2e} ({par['loss_agentrt']:.6f} vs {par['loss_trl']:.6f}), gradient "
          f"norm {par['grad_norm']:.1e} relative, direction {par['grad_direction']:.1e} ("
          f"{par['rewards']:.0f} right answers in the batch); matmuls {par['dtypes']}")
    tol = TOL[a.precision]
    bad = {k: par[k] for k in tol if not par[k] <= tol[k]}
    want = ["bfloat16" if a.precision == "bf16" else "float32"]
    if any(v != want for v in par["dtypes"].values()):  # not at equal precision
        bad["matmul dtypes"] = par["dtypes"]
    if bad:
        sys.exit(f"PARITY FAILED for {preset}: {bad} exceed the {a.precision} tolerances {tol}")


def compare(preset: str, model_dir: Path, n: int, a: argparse.Namespace,
            cost: UpdateCost | None = None) -> dict[str, float]:
    """Interleaved reps of every arm; returns each agentrt arm's median ratio to TRL. Where
    TRL's vLLM colocate mode fails, says why and measures TRL with its HF generate instead."""
    arms = {"agentrt": ("agentrt", a.set, a.compile, "sdpa")}
    for attn in a.trl_attention.split(","):
        tag = "" if attn == "sdpa" else f"-{attn}"
        arms[f"TRL{tag}"] = ("trl", [], False, attn)
        if a.compile:  # TRL's torch_compile also runs its generate through the compiled model
            arms[f"TRL-compiled{tag}"] = ("trl", [], True, attn)
    if a.base_set:
        arms["agentrt-base"] = ("agentrt", a.set + a.base_set, a.compile, "sdpa")
    names = list(arms)
    runs: dict[str, list[dict]] = {k: [] for k in names}
    trl_backend = a.backend
    for rep in range(a.reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            kind, overrides, compiled, attn = arms[name]
            backend = trl_backend if kind == "trl" else a.backend
            try:
                runs[name].append(worker(kind, model_dir, n, a, overrides, backend, compiled,
                                         attn))
            except RuntimeError as exc:
                if kind != "trl" or backend != "vllm":
                    raise
                errors = [ln for ln in str(exc).splitlines() if "Error" in ln] or ["?"]
                print(f"  TRL with vLLM (colocate) does not run here: {errors[-1].strip()}; "
                      "TRL is measured with its HF generate instead")
                trl_backend = "hf"
                runs[name].append(worker(kind, model_dir, n, a, overrides, "hf", compiled,
                                         attn))
    print(f"{preset}, {n} generated tokens (load {os.getloadavg()[0]:.1f}):")
    ratios = {}
    for name in names:
        show(name, runs[name])
    if cost is not None:
        print(f"  update MFU (forward + backward model FLOPs / the {cost.precision} GEMM peak "
              f"{cost.peak:.0f} GFLOP/s, {cost.gemm}): " + ", ".join(
                  f"{name} {statistics.median(cost.mfu(r) for r in runs[name]):.0%}"
                  for name in names))
    trls = [name for name in names if name.startswith("TRL")]
    # with several TRL arms, against TRL's fastest in each repetition (TRL-best)
    best = [max((runs[t][rep] for t in trls), key=lambda r: r["steps_per_s"])
            for rep in range(a.reps)]
    for name in names:
        if name.startswith("TRL"):
            continue
        for trl, theirs in [(t, runs[t]) for t in trls] + [("TRL-best", best)] * (len(trls) > 1):
            per_rep = [x["steps_per_s"] / y["steps_per_s"] for x, y in zip(runs[name], theirs)]
            ratios[f"{name}/{trl}"] = statistics.median(per_rep)
            cpu = [y["cpu_s_per_step"] / x["cpu_s_per_step"] for x, y in zip(runs[name], theirs)]
            print(f"  {name}/{trl} steps per second: {statistics.median(per_rep):.2f}x (per rep: "
                  f"{', '.join(f'{r:.2f}' for r in per_rep)}); per CPU second: "
                  f"{statistics.median(cpu):.2f}x (per rep: {', '.join(f'{r:.2f}' for r in cpu)})")
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama-tiny,llama-small")
    ap.add_argument("--tokens", default="6,32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="both sides: fp32, or bf16 autocast over fp32 weights (agentrt "
                    "policy.model.dtype, TRL bf16=True)")
    ap.add_argument("--compile", action="store_true",
                    help="agentrt with policy.compile, against TRL eager and TRL torch_compile="
                    "True and the faster per repetition; use --warmup 2 or more")
    ap.add_argument("--trl-attention", default="sdpa",
                    help="a TRL arm per transformers attention, e.g. sdpa,eager (agentrt's "
                    "auto runs matmul attention, transformers' eager, under bf16 on CPU)")
    ap.add_argument("--trl-keep-memory", action="store_true",
                    help="TRL's processes keep freed memory too (glibc env, as agentrt's "
                    "runtime.keep_freed_memory)")
    ap.add_argument("--attention", default="sdpa", help=argparse.SUPPRESS)
    ap.add_argument("--set", action="append", default=[], help="agentrt override KEY=VALUE")
    ap.add_argument("--base-set", action="append", default=[],
                    help="adds an arm agentrt-base with these overrides on top of --set")
    ap.add_argument("--skip-parity", action="store_true")
    ap.add_argument("--worker", choices=("agentrt", "trl", "parity"), help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        import torch

        torch.set_num_threads(a.threads)
        a.tokens = int(a.tokens)
        if a.compile and a.worker == "agentrt":
            a.set = [*a.set, "policy.compile=true"]
        if a.worker == "parity":
            from vs_trl_parity import run_parity as run  # bench/ is the script's folder
        else:
            run = {"agentrt": run_agentrt, "trl": run_trl}[a.worker]
        print(json.dumps(run(a)))
        return
    from agentrt.policies.models import build_model

    tokens = [int(t) for t in a.tokens.split(",")]
    print(f"cpus {os.cpu_count()}, threads {a.threads}, load average "
          f"{os.getloadavg()[0]:.1f}; {PROMPTS} prompts x {GROUP} completions per step, "
          f"{a.reps} interleaved reps x {a.steps} timed steps (+{a.warmup} warm-up), fresh "
          f"process per arm; backend {a.backend}, {a.precision}"
          + (", agentrt compiled" if a.compile else "") + f"; agentrt overrides {a.set or 'none'}"
          + (f", agentrt-base adds {a.base_set}" if a.base_set else ""))
    summary = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in a.models.split(","):
            model_dir = build_model(Path(tmp) / preset, preset, seed=SEED)
            if not a.skip_parity:
                parity(preset, model_dir, tokens[0], a)
            cost = UpdateCost(model_dir, a.precision)
            for n in tokens:
                for name, r in compare(preset, model_dir, n, a, cost).items():
                    summary.append(f"{preset} {n} tok {name} {r:.2f}x")
    if summary:
        print("steps per second ratios (median of reps): " + "; ".join(summary))


if __name__ == "__main__":
    main()
