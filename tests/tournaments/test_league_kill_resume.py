"""Must-show 6: a Ray + vLLM league killed with SIGKILL mid-run resumes as if never stopped.

`agentrt tournament run CONFIG` (LoRA policy, `rollout.backend: vllm`, `runtime.backend: ray`)
runs twice side by side from the same seed: once to the end (the reference, in its own folder),
and once killed with SIGKILL on its whole process group after its step-2 checkpoint, once the
matches of a later step are stored. The kill must take the Ray services and the worker holding
the vLLM engine down too. The same command then resumes the killed run to the end, and:

- its match records (ids, seats with versions, outcomes, lengths, invalid moves, steps) and its
  final weights equal the reference run's: the records the killed run stored after its last
  checkpoint were dropped and the matches played again, none twice;
- the vLLM engine serves the checkpoint's weights after the resume, before any new update: the
  checkpoint is loaded into the run's pool the way the resume does (`load_state_dict` of each
  pool, which syncs the rollout) and vLLM's greedy output, of the live policy and of each frozen
  snapshot adapter, equals HF generate over the checkpoint's weights (same tokens, log-probs
  within 1e-4). This runs in this process (`runtime.backend: local`, the same PolicyWorker as
  in the Ray actor) while the resumed run starts up.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

import pytest
import torch
import yaml

from agentrt.config.load import validate_config
from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import RuntimeConfig
from agentrt.controller.checkpoint import load_checkpoint
from agentrt.controller.run_dir import RunDir

STEPS = 6
MIN_CHECKPOINT = 2  # the killed run must have trained past a checkpoint beyond the warm start


def league_config(run_dir: Path, model_dir: Path) -> dict:
    vllm = {"kv_cache_gib": 0.25, "max_model_len": 256, "max_num_seqs": 32}
    return {
        "seed": 3, "run_dir": str(run_dir), "progress": False, "threads": 1,
        "envs": [{"id": "TicTacToe-v0", "template": {"history": False}}],
        "policies": [{"id": "lm", "model": {"path": str(model_dir)},
                      "lora": {"enabled": True, "r": 8, "alpha": 16},
                      "rollout": {"backend": "vllm", "sampling": {"max_new_tokens": 3},
                                  "vllm": vllm},
                      "optim": {"lr": 1e-2}, "algorithm": {"advantage": "rae"}}],
        "baselines": [{"id": "random", "kind": "random", "seed": 1}],
        "schedule": {"format": "pfsp", "snapshot": {"every": 2, "win_rate": None,
                                                    "min_steps": 1}},
        # Retried invalid moves give every turn its own return, so each step changes the policy.
        "runner": {"invalid_action": "retry", "max_retries": 2},
        "warm_start": {"steps": 1, "games_per_step": 4},
        "train": {"steps": STEPS, "games_per_step": 8},
        "eval": {"every": 100, "games": 2},
        "checkpoint": {"every": 2, "keep": 2},
        "runtime": {"backend": "ray", "num_cpus": 2},
    }


# ---------------------------------------------------------------------- processes
class Run:
    """`agentrt tournament run` in a subprocess: its own session (so one killpg reaches every
    process it starts) and its own Ray temp folder (short: Ray's socket paths are limited)."""

    def __init__(self, cfg_path: Path, log: Path, *args: str) -> None:
        self.ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agentrt.cli", "tournament", "run", str(cfg_path), *args],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "RAY_TMPDIR": self.ray_tmp}, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> list[int]:
        """Live (not zombie) processes of this run: its session, or its Ray temp folder."""
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if not proc.name.isdigit():
                    continue
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if fields[0] != "Z" and (int(fields[3]) == self.proc.pid
                                     or self.ray_tmp.encode() in cmdline):
                found.append(int(proc.name))
        return found

    def worker_pids(self) -> list[int]:
        found = re.findall(r"workers up \(pids \[([\d, ]+)\]", self.output())
        return [int(p) for group in found for p in re.findall(r"\d+", group)]

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"run did not finish in {timeout:.0f} s; log:\n{self.output()[-3000:]}")

    def cleanup(self) -> None:
        """Kills whatever of it is left (by pid, all ours) and removes its Ray temp folder."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in self.alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


def wait_for(cond, timeout: float, every: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return cond()


def adapter_folders(pids: list[int]) -> list[Path]:
    """vLLM adapter stores (agentrt.runtime.rollout.vllm_backend._adapter_store) of these processes."""
    roots = {Path("/dev/shm"), Path(tempfile.gettempdir())}
    return [p for root in roots if root.is_dir() for pid in pids
            for p in root.glob(f"agentrt-lora-{pid}-*")]


# ---------------------------------------------------------------------- run folder
def stored_steps(run_dir: Path) -> set[int]:
    db = run_dir / "matches.sqlite"
    if not db.is_file():
        return set()
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as con:
            return {int(s) for (s,) in con.execute("SELECT DISTINCT step FROM matches")}
    except sqlite3.Error:  # not created yet, or locked by the writer: ask again
        return set()


def checkpoint_step(run_dir: Path) -> int:
    ckpts = RunDir(run_dir).checkpoints()
    return int(ckpts[-1].name.split("_")[1]) if ckpts else -1


def records(run_dir: Path) -> list[tuple]:
    """Every stored match in full (players with versions, scores, length, invalid moves, env
    seed, how it ended) with its step, ordered by step and match id."""
    from agentrt.tournaments.records import MatchStore

    with MatchStore(run_dir) as store:
        return list(store.results())


# ---------------------------------------------------------------------- vLLM vs HF
def game_prompts(tokenizer) -> list[list[int]]:
    """Prompts as the league's template renders them, from a few positions of real games."""
    import random

    from agentrt.envs.registration import make_multi

    prompts = []
    for seed in range(8):
        env, rng = make_multi("TicTacToe-v0"), random.Random(seed)
        env.reset(seed=seed)
        for _ in range(seed % 5):  # at most 4 moves: nobody has won yet
            env.step(rng.choice(list(env.legal_actions(env.agent_selection))))
        text = env.observe(env.agent_selection) + "\nAction: "
        prompts.append([tokenizer.bos_token_id] + tokenizer.encode(text, add_special_tokens=False))
    return prompts


def served_vs_hf(cfg_dict: dict, state: dict, scratch: Path) -> dict[str, tuple]:
    """Greedy completions per policy/snapshot of the checkpoint ``state``: (vLLM before loading
    it, vLLM after loading it as the resume does, HF generate over its weights)."""
    from agentrt.controller.loop import Controller
    from agentrt.tournaments.run_config import TournamentRunConfig
    from agentrt.runtime.shared_model import SharedModel

    cfg = validate_config(cfg_dict, TournamentRunConfig)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=16)
    ctl = Controller(list(cfg.policies), RuntimeConfig(), RunDir(scratch), seed=cfg.seed,
                     total_steps=cfg.train.steps)
    try:
        pool = ctl.pool_of("lm")
        prompts = game_prompts(pool.tokenizer)
        fresh = pool.generate(prompts, greedy, adapter="lm")
        for p in ctl.pools:  # what Controller's resume does; it also syncs the vLLM engine
            p.load_state_dict(state["pools"][p.cfg.id])
        lm = state["pools"]["lm"]
        weights = {"lm": lm["policies"]["lm"]["model"]} | {
            k: s["weights"] for k, s in lm["snapshots"].items()}
        served = {k: pool.generate(prompts, greedy, adapter=k) for k in weights}
    finally:
        ctl.shutdown()
    hf_cfg = cfg.policies[0].model_copy(update={"rollout": cfg.policies[0].rollout.model_copy(
        update={"backend": "hf"})})
    hf = SharedModel(hf_cfg, seed=cfg.seed)
    out = {}
    for key, w in weights.items():
        hf.load_weights("lm", w)  # the checkpoint's weights as the HF model's only adapter
        out[key] = (fresh, served[key], hf.generate(prompts, greedy, "lm"))
    return out


def logprob_gap(a: list, b: list) -> float:
    """Largest |log-prob difference| over the tokens of two lists of completions."""
    return max(abs(x - y) for ca, cb in zip(a, b) for x, y in zip(ca.logprobs, cb.logprobs))


# ---------------------------------------------------------------------- the test
@pytest.mark.slow
def test_killed_ray_vllm_league_resumes_to_the_uninterrupted_records(tmp_path, tiny_model_dir):
    killed_dir, ref_dir = tmp_path / "killed", tmp_path / "reference"
    cfg = league_config(killed_dir, tiny_model_dir)
    cfg_path = tmp_path / "league.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    started = time.monotonic()
    # Reference and killed run start together (each starts its own Ray; start-up dominates).
    ref = Run(cfg_path, tmp_path / "reference.log", "--run-dir", str(ref_dir))
    killed = Run(cfg_path, tmp_path / "killed.log")
    runs = [ref, killed]
    try:
        # Kill once a step after a checkpoint (>= step 2) has stored its matches: the resume
        # must drop those records and play the matches again.
        def past_checkpoint() -> bool:
            ckpt = checkpoint_step(killed_dir)
            return ckpt >= MIN_CHECKPOINT and max(stored_steps(killed_dir), default=-1) > ckpt

        assert wait_for(lambda: past_checkpoint() or killed.proc.poll() is not None, 600), \
            "no checkpoint past step 2 in 600 s"
        assert killed.proc.poll() is None, f"the run ended by itself:\n{killed.output()[-3000:]}"
        os.killpg(killed.proc.pid, signal.SIGKILL)
        assert killed.proc.wait(30) == -signal.SIGKILL
        killed_at = time.monotonic() - started
        ckpt = checkpoint_step(killed_dir)
        assert MIN_CHECKPOINT <= ckpt < STEPS and max(stored_steps(killed_dir)) > ckpt
        # Ray's services and the worker holding the vLLM engine go with the process group.
        assert wait_for(lambda: not killed.alive(), 60), f"survived the kill: {killed.alive()}"
        workers = killed.worker_pids()
        assert workers, killed.output()[-3000:]
        for folder in adapter_folders(workers):  # a SIGKILLed engine cannot delete its own
            shutil.rmtree(folder, ignore_errors=True)
        state = load_checkpoint(RunDir(killed_dir).checkpoints()[-1])

        # The same command again: a fresh Ray starts and the run resumes from the checkpoint.
        resumed = Run(cfg_path, tmp_path / "resumed.log")
        runs.append(resumed)
        # Meanwhile: does the resume path put the checkpoint's weights into vLLM?
        greedy = served_vs_hf(cfg, state, tmp_path / "scratch")
        for run in (ref, resumed):
            assert run.wait(600) == 0, run.output()[-3000:]
            assert wait_for(lambda: not run.alive(), 30), f"left running: {run.alive()}"
        total = time.monotonic() - started
    finally:
        for run in runs:
            run.cleanup()

    assert f"resumed from {killed_dir / 'checkpoints' / f'step_{ckpt}'}" in resumed.output()
    assert {"lm", "lm@0", f"lm@{ckpt}"} <= set(greedy)
    for key, (_, served, hf) in greedy.items():  # fp32 both; kernels differ (measured 1e-6)
        assert [c.response_ids for c in served] == [c.response_ids for c in hf], key
        assert logprob_gap(served, hf) < 1e-4, f"{key}: vLLM does not serve the checkpoint"
    fresh, served, _ = greedy["lm"]  # not vacuous: the checkpoint is not the initial adapter
    assert logprob_gap(served, fresh) > 1e-2

    a, b = records(ref_dir), records(killed_dir)
    assert len(a) == STEPS * 8
    assert a == b  # same matches, seats, versions and outcomes; none lost or played twice
    assert [r["step"] for r in RunDir(killed_dir).read_metrics()] == list(range(STEPS + 1))
    final_a, final_b = (load_checkpoint(RunDir(d).checkpoints()[-1])["pools"]["lm"]
                        for d in (ref_dir, killed_dir))
    assert final_b["policies"]["lm"]["version"] == STEPS
    for k, v in final_a["policies"]["lm"]["model"].items():
        assert torch.equal(v, final_b["policies"]["lm"]["model"][k]), k
    # Finished runs stop their engines: no adapter folder outlives its worker.
    assert not adapter_folders(ref.worker_pids() + resumed.worker_pids())
    print(f"killed at {killed_at:.0f} s (checkpoint step {ckpt}); all done at {total:.0f} s")
