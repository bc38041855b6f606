"""``make gpu-check``: every workload a few steps on a CUDA device, one line per check.

Each check is a real run of the command line (``agentrt train``, ``tournament run``,
``decompose run``, ``serve``) in a process of its own, on a config from ``examples/`` cut to
``--steps`` steps with every policy on the device in ``--dtype`` (bf16 by default): GRPO, PPO
with a critic and DPO on the HF rollout, GRPO on the vLLM rollout (full weights and LoRA, sleep
mode on where vLLM has it), two non-Llama architectures, a LoRA league with a snapshot, the
decomposer, ``serve`` answering one request from the trained run, and 2 data-parallel workers
(NCCL), replicas and FSDP-sharded, where 2 GPUs exist. It prints ``PASS|FAIL|SKIP <check> <detail>`` per check and exits 1
on any FAIL. Without a CUDA device it prints one ``no CUDA device: ...`` line and exits 0.

    python -m agentrt.tools.gpu_check [--only train-grpo serve ...] [--steps 2] [--keep DIR]

``--device cpu`` (hidden) runs the same checks on the CPU: how the checks themselves are
debugged on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

Config = dict[str, Any]


@dataclass
class Check:
    """One workload run: ``command`` (the CLI's words before the config) on ``example`` as
    ``edit`` changes it; ``needs`` names a check whose run folder it reads."""

    name: str
    command: list[str]
    example: str
    edit: Callable[[Config, "Settings"], None]
    needs: str | None = None
    requires: Callable[["Settings"], str | None] = field(default=lambda s: None)


@dataclass
class Settings:
    device: str
    dtype: str
    steps: int
    examples: Path
    gpus: int


def policies(cfg: Config) -> list[Config]:
    return [cfg["policy"]] if "policy" in cfg else list(cfg["policies"])


def base_edit(cfg: Config, s: Settings, preset: str | None = None) -> None:
    """Every policy on the device in the dtype, a short run, no progress bars."""
    for p in policies(cfg):
        model = p.setdefault("model", {})
        if preset is not None:
            model.pop("path", None)
            model["preset"] = preset
        model.update(device=s.device, dtype=s.dtype)
        p["micro_batch_size"] = 16
    cfg["progress"] = False
    cfg["checkpoint"] = {"every": s.steps}
    cfg.setdefault("eval", {})["every"] = s.steps
    if "sft" in cfg:
        cfg["sft"].update(steps=2, warmup_steps=0)


def task_edit(cfg: Config, s: Settings) -> None:
    base_edit(cfg, s)
    cfg["task"].update(train_size=256, eval_size=16)
    cfg["train"] = {"steps": s.steps, "prompts_per_step": 8,
                    **({"group_size": 4} if "group_size" in cfg.get("train", {}) else {})}


def with_policy(**changes: Any) -> Callable[[Config, Settings], None]:
    """task_edit, then ``changes`` merged into the policy section."""
    def edit(cfg: Config, s: Settings) -> None:
        task_edit(cfg, s)
        merge(cfg["policy"], changes)
    return edit


def arch(preset: str) -> Callable[[Config, Settings], None]:
    def edit(cfg: Config, s: Settings) -> None:
        task_edit(cfg, s)
        base_edit(cfg, s, preset)
    return edit


def merge(into: Config, changes: Config) -> None:
    for k, v in changes.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


VLLM = {"rollout": {"backend": "vllm", "vllm": {"kv_cache_gib": 1.0, "max_model_len": 512}}}


def league_edit(cfg: Config, s: Settings) -> None:
    base_edit(cfg, s)
    cfg["policies"][0]["lora"] = {"enabled": True, "r": 8}
    cfg["warm_start"].update(steps=2, games_per_step=8)
    cfg["train"] = {"steps": s.steps, "games_per_step": 8}
    cfg["schedule"]["snapshot"] = {"every": 1, "win_rate": None, "min_steps": 1}
    cfg["eval"].update(games=8)


def decompose_edit(cfg: Config, s: Settings) -> None:
    base_edit(cfg, s)
    for p in cfg["policies"]:
        p["sft_steps"] = 2 if "sft_steps" in p else p.get("sft_steps", 0)
    cfg["family"].update(train_size=64, eval_size=8)
    cfg["train"] = {"steps": s.steps, "tasks_per_step": 4, "group_size": 2}


def workers_edit(cfg: Config, s: Settings) -> None:
    task_edit(cfg, s)
    cfg["runtime"] = {"backend": "ray", "num_cpus": 2 if s.device == "cpu" else None}
    cfg["policy"]["resources"] = {"num_workers": 2, "cpus_per_worker": 1,
                                  "gpus_per_worker": 1 if s.device == "cuda" else 0}


def sharded_edit(cfg: Config, s: Settings) -> None:
    workers_edit(cfg, s)
    cfg["policy"]["resources"]["sharding"] = "fsdp"


def needs_vllm(s: Settings) -> str | None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vllm is not installed (make install-vllm VLLM_PKG=vllm)"
    return None


def needs_two_gpus(s: Settings) -> str | None:
    if s.device == "cuda" and s.gpus < 2:
        return f"2 workers with NCCL need 2 GPUs; torch sees {s.gpus}"
    return None


TRAIN, LEAGUE, DECOMPOSE = ["train"], ["tournament", "run"], ["decompose", "run"]
CHECKS = [
    Check("train-grpo", TRAIN, "arith_grpo.yaml", task_edit),
    Check("train-ppo-critic", TRAIN, "arith_grpo.yaml", with_policy(algorithm={"name": "ppo"})),
    Check("train-dpo", TRAIN, "arith_dpo.yaml", task_edit),
    Check("train-grpo-gpt2", TRAIN, "arith_grpo.yaml", arch("gpt2-tiny")),
    Check("train-grpo-qwen2", TRAIN, "arith_grpo.yaml", arch("qwen2-tiny")),
    Check("train-grpo-vllm", TRAIN, "arith_grpo.yaml", with_policy(**VLLM),
          requires=needs_vllm),
    Check("train-grpo-vllm-lora", TRAIN, "arith_grpo.yaml",
          with_policy(lora={"enabled": True, "r": 8}, **VLLM), requires=needs_vllm),
    Check("league-lora", LEAGUE, "ttt_league.yaml", league_edit),
    Check("decompose", DECOMPOSE, "decompose_wordchain.yaml", decompose_edit),
    Check("serve", ["serve"], "", task_edit, needs="train-grpo"),
    Check("workers-2", TRAIN, "arith_grpo.yaml", workers_edit, requires=needs_two_gpus),
    Check("workers-2-fsdp", TRAIN, "arith_grpo.yaml", sharded_edit, requires=needs_two_gpus),
]


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[-1] if lines else "(no output)"
    return line if len(line) <= 240 else line[:237] + "..."


def run_check(check: Check, s: Settings, work: Path, timeout: float) -> tuple[str, str]:
    """(PASS|FAIL, detail) of one training run."""
    cfg = yaml.safe_load((s.examples / check.example).read_text())
    check.edit(cfg, s)
    run_dir = work / check.name
    cfg["run_dir"] = str(run_dir)
    path = work / f"{check.name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "agentrt.cli", *check.command, str(path)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "FAIL", f"no result in {timeout:.0f} s"
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        return "FAIL", last_line(proc.stderr or proc.stdout)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    steps = sorted({r["step"] for r in rows if "step" in r})
    if not steps or steps[-1] < s.steps:
        return "FAIL", f"metrics.jsonl reaches step {steps[-1] if steps else None}, not {s.steps}"
    shown = {k: v for k, v in rows[-1].items()
             if k in ("reward/mean", "actor/loss", "pref/loss", "timing_s/sync", "eval/accuracy")}
    return "PASS", (f"to step {steps[-1]} in {seconds:.0f} s on {s.device} {s.dtype}; " +
                    ", ".join(f"{k} {v:.3g}" for k, v in shown.items()))


def serve_check(s: Settings, run_dir: Path, timeout: float) -> tuple[str, str]:
    """``agentrt serve`` on a trained run folder, on the device: one completion request."""
    import httpx

    cmd = [sys.executable, "-m", "agentrt.cli", "serve", str(run_dir), "--port", "0",
           "--device", s.device, "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, seen = None, []
        deadline = time.monotonic() + timeout
        while url is None and time.monotonic() < deadline and proc.stdout is not None:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            found = re.search(r" on (http://\S+) \(backend", line)
            url = found.group(1) if found else None
        if url is None:
            return "FAIL", last_line("".join(seen))
        name = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        res = httpx.post(f"{url}/v1/completions", timeout=timeout, json={
            "model": name, "prompt": "12+30=", "max_tokens": 4, "temperature": 0})
        if res.status_code != 200:
            return "FAIL", f"HTTP {res.status_code}: {last_line(res.text)}"
        text = res.json()["choices"][0]["text"]
        return "PASS", f"{name} on {s.device} answered {text!r}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def no_device_line() -> str | None:
    """The line a machine without a CUDA device gets, else None."""
    import torch

    if torch.cuda.is_available():
        return None
    build = torch.version.cuda or "none (a CPU build)"
    return (f"no CUDA device: torch {torch.__version__} sees no GPU (CUDA build: {build}); "
            "gpu-check runs nothing here")


def run_all(s: Settings, only: list[str], work: Path, timeout: float) -> list[str]:
    """Runs the checks in order, printing each line as it comes; returns the statuses."""
    passed: dict[str, Path] = {}
    statuses = []
    for check in CHECKS:
        if only and check.name not in only:
            continue
        why = check.requires(s)
        if why is None and check.needs is not None and check.needs not in passed:
            why = f"needs a passing {check.needs}"
        if why is not None:
            status, detail = "SKIP", why
        elif check.name == "serve":
            status, detail = serve_check(s, passed[check.needs], timeout)
        else:
            status, detail = run_check(check, s, work, timeout)
        if status == "PASS":
            passed[check.name] = work / check.name
        statuses.append(status)
        print(f"{status} {check.name} {detail}", flush=True)
    return statuses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=[], help="Check names to run (default all: "
                        + ", ".join(c.name for c in CHECKS) + ").")
    parser.add_argument("--steps", type=int, default=2, help="Training steps per run.")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--timeout", type=float, default=900.0, help="Seconds per check.")
    parser.add_argument("--examples", type=Path, default=Path("examples"))
    parser.add_argument("--keep", type=Path, default=None, help="Run folders here (kept).")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only) - {c.name for c in CHECKS})
    if unknown:
        parser.error(f"--only: no check named {', '.join(unknown)}")
    if args.device == "cuda":
        line = no_device_line()
        if line is not None:
            print(line, flush=True)
            return 0
    import torch

    s = Settings(args.device, args.dtype, args.steps, args.examples,
                 torch.cuda.device_count() if args.device == "cuda" else 0)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        statuses = run_all(s, args.only, args.keep, args.timeout)
    else:
        with tempfile.TemporaryDirectory(prefix="agentrt-gpu-check-") as tmp:
            statuses = run_all(s, args.only, Path(tmp), args.timeout)
    return 1 if "FAIL" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
