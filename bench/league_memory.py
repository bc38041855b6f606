"""League memory: two LoRA learners and 20 frozen snapshots cost about what two learners cost.

    .venv/bin/python bench/league_memory.py                          # llama-base (34 M), 20 snaps
    .venv/bin/python bench/league_memory.py --preset llama-small --arms no-snapshots lora-snapshots

Every arm runs in a fresh subprocess, so its peak resident memory (``ru_maxrss``) is its own, on
the real runtime: a :class:`~agentrt.runtime.pool.LocalPool` with two LoRA policies on one base model.
Each arm warms up (one GRPO step per learner), then plays the same league schedule: rounds of
one GRPO step per learner followed by a snapshot of each (so snapshots differ), then one
generation with every snapshot (all of them live at once) and one more step per learner.

- ``no-snapshots``: the schedule without snapshots (the same number of generate calls go to
  the learners): what the two learners cost.
- ``lora-snapshots``: ``pool.snapshot`` -> 20 frozen adapters in the pool (asserted: peak at
  most 1.5x ``no-snapshots``; the bench exits 1 otherwise).
- ``deepcopies``: the same pool, each snapshot a ``copy.deepcopy`` of the model (what a league
  of model copies costs; not asserted, shown for contrast).
- ``full-weight``: two full-weight policies (one pool each) whose snapshots are CPU copies of
  the weights (what ``pool.snapshot`` does without LoRA; not asserted).

Torch runs one thread per arm: on a shared 2-core machine two threads spin against other
work and run 10x slower.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ARMS = ("no-snapshots", "lora-snapshots", "deepcopies", "full-weight")
LEARNERS = ("p0", "p1")
MAX_RATIO = 1.5
MiB = 1024 * 1024


# ---------------------------------------------------------------------------- one arm (child)
def make_pools(arm: str, model_dir: str, new_tokens: int, batch: int) -> dict[str, Any]:
    """Learner id -> its pool: one pool (one base, two adapters) for LoRA, else one each."""
    from agentrt.config.rollout import SamplingConfig
    from agentrt.config.sections import ModelConfig, PolicyConfig
    from agentrt.runtime.pool import LocalPool

    lora = arm != "full-weight"

    def policy(pid: str) -> PolicyConfig:
        return PolicyConfig(id=pid, model=ModelConfig(path=model_dir), lora={"enabled": lora},
                            optim={"lr": 1e-2 if lora else 1e-4}, micro_batch_size=batch,
                            rollout={"sampling": SamplingConfig(max_new_tokens=new_tokens)})

    if lora:
        return dict.fromkeys(LEARNERS, LocalPool([policy(p) for p in LEARNERS], seed=0))
    return {p: LocalPool([policy(p)], seed=i) for i, p in enumerate(LEARNERS)}


def grpo_step(pool: Any, pid: str, prompts: list[list[int]]) -> None:
    """Generate with ``pid`` and train it one GRPO step (groups of 2 on a toy reward)."""
    from agentrt.core.types import Trajectory, Turn

    comps = pool.generate(prompts, adapter=pid)
    pool.train([Trajectory([Turn(p, c.response_ids, c.logprobs, policy_id=pid,
                                 reward=float(c.response_ids[0] % 2))],
                           group_id=str(i // 2), policy_id=pid)
                for i, (p, c) in enumerate(zip(prompts, comps))], adapter=pid)


def freeze(arm: str, pool: Any, pid: str, tag: str) -> Any:
    """One snapshot of ``pid``: a name in the pool, or a deep copy's rollout."""
    if arm != "deepcopies":
        return pool.snapshot(pid, tag)
    from agentrt.runtime.rollout.hf import HFRollout

    model = copy.deepcopy(pool.learner.model)
    model.set_adapter(pid)
    return HFRollout(model, pool.tokenizer, pool.policies[pid].rollout.sampling)


def run_arm(arm: str, model_dir: str, snapshots: int, prompts_n: int, new_tokens: int,
            threads: int) -> dict[str, Any]:
    """Plays the league schedule of ``arm``; returns its memory figures (bytes, seconds)."""
    import psutil
    import torch

    torch.set_num_threads(threads)
    start = time.perf_counter()
    pools = make_pools(arm, model_dir, new_tokens, prompts_n)
    tok = pools["p0"].tokenizer
    prompts = [[tok.bos_token_id] + tok.encode(f"{a}+{a}=") for a in range(prompts_n // 2)
               for _ in range(2)]
    for pid in LEARNERS:  # warm-up: optimizer state, allocator pools, first-call caches
        grpo_step(pools[pid], pid, prompts)
    # What one snapshot holds: the learner's trainable weights (an adapter, or every weight),
    # or for a deep copy the whole module. Read here, before the league, as weights() clones.
    snap_bytes = (sum(t.nbytes for t in pools["p0"].learner.model.state_dict().values())
                  if arm == "deepcopies" else
                  sum(t.nbytes for t in pools["p0"].weights("p0").values()))
    rss_warm = psutil.Process().memory_info().rss
    frozen: list[tuple[str, Any]] = []  # (source learner, snapshot name or rollout)
    for k in range(snapshots // len(LEARNERS)):
        for pid in LEARNERS:
            grpo_step(pools[pid], pid, prompts)
            if arm != "no-snapshots":
                frozen.append((pid, freeze(arm, pools[pid], pid, str(k))))
    # Every snapshot generates, all live at once; no-snapshots sends as many calls to learners.
    for pid, snap in frozen or [(p, p) for p in LEARNERS * (snapshots // len(LEARNERS))]:
        out = (pools[pid].generate(prompts, adapter=snap) if isinstance(snap, str)
               else snap.generate(prompts))
        assert len(out) == len(prompts)
    for pid in LEARNERS:
        grpo_step(pools[pid], pid, prompts)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"arm": arm, "snapshots": len(frozen), "peak": peak,
            "growth": psutil.Process().memory_info().rss - rss_warm,
            "snap_bytes": snap_bytes * len(frozen), "seconds": time.perf_counter() - start}


# ---------------------------------------------------------------------------- driver
def measure(arm: str, args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", arm, "--model-dir", str(model_dir),
           "--snapshots", str(args.snapshots), "--prompts", str(args.prompts),
           "--new-tokens", str(args.new_tokens), "--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"arm {arm!r} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(results: dict[str, dict[str, Any]], base: dict[str, Any] | None) -> None:
    head = (f"{'arm':<15} {'snaps':>5} {'peak RSS MiB':>12} {'vs no-snap':>10} "
            f"{'growth MiB':>10} {'MiB/snap':>8} {'weights MiB/snap':>16} {'arm s':>7}")
    print(head)
    print("-" * len(head))
    for r in results.values():
        per = r["snap_bytes"] / r["snapshots"] / MiB if r["snapshots"] else 0.0
        grown = r["growth"] / r["snapshots"] / MiB if r["snapshots"] else 0.0
        ratio = (f"{r['peak'] / base['peak']:.2f}x" if base and r["arm"] != "full-weight"
                 else "-")
        print(f"{r['arm']:<15} {r['snapshots']:>5} {r['peak'] / MiB:>12.0f} {ratio:>10} "
              f"{r['growth'] / MiB:>10.0f} {grown:>8.1f} {per:>16.2f} {r['seconds']:>7.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="llama-base", help="model preset of the shared base")
    ap.add_argument("--snapshots", type=int, default=20, help="frozen snapshots (even)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per generate/train call")
    ap.add_argument("--new-tokens", type=int, default=8, help="tokens generated per prompt")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per arm")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    ap.add_argument("--model-dir", help="use this model folder instead of building the preset")
    ap.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_arm(args.child, args.model_dir, args.snapshots, args.prompts,
                                 args.new_tokens, args.threads)))
        return
    if args.snapshots % len(LEARNERS):
        ap.error("--snapshots must be even (one per learner per round)")
    with tempfile.TemporaryDirectory(prefix="league-memory-") as tmp:
        model_dir = Path(args.model_dir) if args.model_dir else Path(tmp) / args.preset
        if not args.model_dir:
            from agentrt.policies.models import build_model

            build_model(model_dir, args.preset, seed=0)
        print(f"preset {args.preset}, 2 LoRA learners (r=8, all linear layers), "
              f"{args.snapshots} snapshots, {args.prompts} prompts x {args.new_tokens} tokens, "
              f"{args.threads} torch thread(s), one fresh process per arm")
        model_mib = sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) / MiB
        print(f"model weights {model_mib:.0f} MiB: {args.snapshots} copies of them would be "
              f"{args.snapshots * model_mib:.0f} MiB")
        results = {arm: measure(arm, args, model_dir) for arm in args.arms}
    base = results.get("no-snapshots")
    report(results, base)
    if base is None or "lora-snapshots" not in results:
        return
    ratio = results["lora-snapshots"]["peak"] / base["peak"]
    verdict = "OK" if ratio <= MAX_RATIO else "FAIL"
    print(f"peak RSS ratio, {args.snapshots} LoRA snapshots / no snapshots: {ratio:.3f} "
          f"(target <= {MAX_RATIO}) {verdict}")
    if ratio > MAX_RATIO:
        sys.exit(1)


if __name__ == "__main__":
    main()
