"""Runs that never lose, mix or corrupt work (issue 18, must-show 1 and 2).

- A damaged newest checkpoint (truncated, zero-filled, garbage, a pickled object, no or a bad
  manifest) is one warning line and the run resumes from the one before, to the same step rows
  an uninterrupted run wrote, none twice; folders such as ``step_10.bak`` or ``notes`` in
  ``checkpoints/`` are ignored. No good checkpoint: one ``error:`` line, exit 2.
- Every checkpoint (train and tournament) loads with ``torch.load(weights_only=True)``.
- A rerun with another seed in a run folder is refused with one line naming the seed;
  ``--resume force`` continues, ``--new-run`` starts over and the folder then holds no record,
  metric or match of the old run; a second process on a folder in use refuses.

Runs are ``agentrt train`` / ``tournament run`` on the tiny model, a few steps, checkpoints at
every step; in-process where the CLI adds nothing, as the CLI where its output is the point.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from agentrt.controller.checkpoint import CheckpointError, load_checkpoint, sha256_of
from agentrt.config.load import validate_config
from agentrt.controller.identity import RunFolderError
from agentrt.controller.run_dir import RunDir
from agentrt.workloads.prompts.workload import Trainer
from agentrt.workloads.prompts.config import TrainConfig

AGENTRT = [sys.executable, "-m", "agentrt.cli"]
STEPS = 3


def train_config(run_dir: Path, model_dir: Path, **over: Any) -> dict[str, Any]:
    cfg = {
        "seed": 0, "run_dir": str(run_dir), "progress": False, "threads": 1,
        "task": {"name": "arithmetic", "train_size": 64, "eval_size": 4},
        "reward": "exact_match",
        "policy": {"model": {"path": str(model_dir)}, "optim": {"lr": 1e-3},
                   "rollout": {"sampling": {"max_new_tokens": 2}}},
        "train": {"steps": STEPS, "prompts_per_step": 2, "group_size": 2},
        "eval": {"every": 100}, "checkpoint": {"every": 1, "keep": 10},
    }
    return cfg | over


def league_config(run_dir: Path, model_dir: Path, **over: Any) -> dict[str, Any]:
    cfg = {
        "seed": 3, "run_dir": str(run_dir), "progress": False, "threads": 1,
        "envs": [{"id": "TicTacToe-v0", "template": {"history": False}}],
        "memory": {"banks": {"notes": {"backend": "faiss", "embedder": "hashing"}}},
        "policies": [{"id": "lm", "model": {"path": str(model_dir)},
                      "rollout": {"sampling": {"max_new_tokens": 2}},
                      "memory": {"bank": "notes", "k": 1, "token_budget": 16},
                      "algorithm": {"advantage": "rae"}}],
        "baselines": [{"id": "random", "kind": "random", "seed": 1}],
        "warm_start": {"steps": 0},
        "train": {"steps": 2, "games_per_step": 4},
        "eval": {"every": 100, "games": 2},
        "checkpoint": {"every": 1, "keep": 10},
    }
    return cfg | over


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(AGENTRT + list(args), capture_output=True, text=True, timeout=300)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The run failed with exit 2 and one ``error:`` line, no traceback; returns the line."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and proc.stderr.rstrip().endswith(errors[0]), proc.stderr[-3000:]
    return errors[0]


def write_yaml(path: Path, cfg: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def train_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A finished 3-step train run with a checkpoint at every step (copy before changing)."""
    run_dir = tmp_path_factory.mktemp("integrity") / "train"
    Trainer(validate_config(train_config(run_dir, tiny_model_dir), TrainConfig)).run()
    return run_dir


@pytest.fixture(scope="module")
def league_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A finished 2-step league: a random baseline (scripted state in every checkpoint) and a
    FAISS memory bank the learner reads and writes (records in every checkpoint)."""
    from agentrt.tournaments.run_config import TournamentRunConfig
    from agentrt.tournaments.trainer import LeagueTrainer

    run_dir = tmp_path_factory.mktemp("integrity") / "league"
    LeagueTrainer(validate_config(league_config(run_dir, tiny_model_dir),
                                  TournamentRunConfig)).run()
    return run_dir


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


# ---------------------------------------------------------------------- damaged checkpoints
class Pickled:
    """Not plain data: loading it with weights_only=False would import and build this class."""


def rewrite_manifest(ckpt: Path) -> None:
    """A manifest that matches whatever state.pt now holds (only loading it can tell)."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    state = ckpt / "state.pt"
    manifest["files"]["state.pt"] = {"bytes": state.stat().st_size, "sha256": sha256_of(state)}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def damage(ckpt: Path, how: str) -> None:
    state = ckpt / "state.pt"
    size = state.stat().st_size
    if how == "truncated":
        state.write_bytes(state.read_bytes()[: size // 2])
    elif how == "zero-filled":
        state.write_bytes(bytes(size))
    elif how == "garbage":
        state.write_bytes(os.urandom(size))
        rewrite_manifest(ckpt)
    elif how == "pickled-object":
        buf = io.BytesIO()
        torch.save({"step": STEPS, "payload": Pickled()}, buf)
        state.write_bytes(buf.getvalue())
        rewrite_manifest(ckpt)
    elif how == "no-manifest":
        (ckpt / "manifest.json").unlink()
    elif how == "bad-manifest":
        (ckpt / "manifest.json").write_text('{"format": 1, "files": ')


REASONS = {"truncated": "does not match its checksum", "zero-filled": "does not match its checksum",
           "garbage": "cannot be loaded as tensors and plain data",
           "pickled-object": "cannot be loaded as tensors and plain data",
           "no-manifest": "no manifest.json", "bad-manifest": "manifest.json is not valid JSON"}


@pytest.mark.parametrize("how", list(REASONS))
def test_a_damaged_latest_checkpoint_resumes_from_the_previous_good_one(
        how, train_run, tiny_model_dir, tmp_path, caplog) -> None:
    run_dir = copy_run(train_run, tmp_path / "run")
    ckpts = run_dir / "checkpoints"
    damage(ckpts / f"step_{STEPS}", how)
    shutil.copytree(ckpts / f"step_{STEPS - 1}", ckpts / "step_10.bak")  # a user's copy
    (ckpts / "notes").mkdir()
    (ckpts / "notes" / "todo.txt").write_text("compare lr")
    assert [p.name for p in RunDir(run_dir).checkpoints()] == [f"step_{i}" for i in range(4)]
    with pytest.raises(CheckpointError, match=REASONS[how]):
        load_checkpoint(ckpts / f"step_{STEPS}")

    with caplog.at_level(logging.WARNING, logger="agentrt"):
        Trainer(validate_config(train_config(run_dir, tiny_model_dir), TrainConfig)).run()
    damaged = [r.getMessage() for r in caplog.records if " is damaged (" in r.getMessage()]
    assert len(damaged) == 1, damaged
    assert str(ckpts / f"step_{STEPS}") in damaged[0] and REASONS[how] in damaged[0]
    assert f"resuming from step_{STEPS - 1}" in damaged[0]
    assert any(f"resumed from {ckpts / f'step_{STEPS - 1}'}" in r.getMessage()
               for r in caplog.records)
    # The lost step was played again: the same row as the uninterrupted run's, not a second one.
    before, after = rows(train_run), rows(run_dir)
    assert [r["step"] for r in after] == list(range(STEPS + 1))
    for key in ("reward/mean", "actor/loss", "actor/grad_norm", "eval/accuracy"):
        assert after[-1][key] == pytest.approx(before[-1][key], abs=1e-6), key
    assert load_checkpoint(ckpts / f"step_{STEPS}")["step"] == STEPS  # written anew, whole
    assert (ckpts / "notes" / "todo.txt").read_text() == "compare lr"
    assert (ckpts / "step_10.bak" / "state.pt").is_file()


def test_no_good_checkpoint_is_one_line_and_exit_2(train_run, tmp_path) -> None:
    run_dir = copy_run(train_run, tmp_path / "run")
    for ckpt in RunDir(run_dir).checkpoints():
        damage(ckpt, "zero-filled")
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) | {"run_dir": str(run_dir)}
    line = one_error_line(cli("train", str(write_yaml(tmp_path / "cfg.yaml", cfg))))
    assert "holds no good checkpoint" in line and f"step_{STEPS}: state.pt does not match" in line
    assert "step_0: state.pt does not match" in line and "--new-run" in line


def test_every_checkpoint_holds_only_tensors_and_plain_data(train_run, league_run) -> None:
    for run_dir in (train_run, league_run):
        ckpts = RunDir(run_dir).checkpoints()
        assert len(ckpts) >= 3
        for ckpt in ckpts:
            state = torch.load(ckpt / "state.pt", weights_only=True)
            manifest = json.loads((ckpt / "manifest.json").read_text())
            assert manifest["format"] == 1 and manifest["step"] == state["step"]
            assert manifest["files"]["state.pt"]["sha256"] == sha256_of(ckpt / "state.pt")
    baseline = load_checkpoint(RunDir(league_run).checkpoints()[-1])["workload"]["baselines"]
    assert set(baseline["random"]) == {"rng", "np_rng"}  # the RNG streams, as data


def test_a_scripted_baseline_resumes_its_random_streams() -> None:
    """The baselines' state in a checkpoint restores their moves exactly (no pickling)."""
    import numpy as np

    from agentrt.envs.registration import make_multi
    from agentrt.policies.base import ActRequest
    from agentrt.policies.scripted import RandomPolicy

    env = make_multi("TicTacToe-v0")
    env.reset(seed=0)
    request = ActRequest(env, "e0", "TicTacToe-v0", env.agent_selection, 0)
    legal = np.ones((4, 9), dtype=bool)

    def moves(policy: RandomPolicy) -> list[Any]:  # both streams: python's and numpy's
        return [policy.choose(request) for _ in range(20)] + policy.act_vector(
            None, np.arange(4), legal).tolist()

    played = RandomPolicy(seed=1)
    moves(played)
    saved = torch.load(io.BytesIO(_saved(played.state_dict())), weights_only=True)
    resumed = RandomPolicy(seed=99)
    resumed.load_state_dict(saved)
    assert moves(resumed) == moves(played)


def _saved(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


# ---------------------------------------------------------------------- run identity
def test_a_rerun_with_another_seed_is_refused_unless_forced(train_run, tiny_model_dir,
                                                           tmp_path, caplog) -> None:
    run_dir = copy_run(train_run, tmp_path / "run")
    def files() -> dict[Path, bytes]:  # but the lock file, which stays for the next process
        return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}

    before = files()
    cfg = train_config(run_dir, tiny_model_dir, seed=1)
    line = one_error_line(cli("train", str(write_yaml(tmp_path / "cfg.yaml", cfg))))
    assert f"run folder {run_dir} holds another run (seed: 0 there, 1 here)" in line
    assert "--new-run" in line and "--resume force" in line
    assert files() == before  # nothing written: config.yaml, run.json, metrics as they were

    # Folder, progress, threads and checkpoint settings may change between resumes.
    same = train_config(run_dir, tiny_model_dir, threads=2,
                        checkpoint={"every": 2, "keep": 3})
    RunDir.open(run_dir, validate_config(same, TrainConfig)).close()

    with caplog.at_level(logging.WARNING, logger="agentrt"):
        Trainer(validate_config(cfg, TrainConfig), start="force").run()
    forced = [r.getMessage() for r in caplog.records if "--resume force" in r.getMessage()]
    assert len(forced) == 1 and "seed: 0 there, 1 here" in forced[0]
    assert json.loads((run_dir / "run.json").read_text())["seed"] == 1  # now this run's
    assert [r["step"] for r in rows(run_dir)] == list(range(STEPS + 1))


def test_run_identity_holds_no_secret_and_names_what_differs() -> None:
    """run.json: credentials (a password field, a URL's password) are no part of a run's
    identity (they may rotate) and nothing in it derives from them; other fields are named."""
    from agentrt.controller.identity import differences, run_identity

    def cfg(seed: int, secret: str, db: int) -> dict[str, Any]:
        bank = {"backend": "redis", "url": f"redis://:{secret}@127.0.0.1:6379/{db}?password="
                f"{secret}", "redis": {"password": secret, "password_env": None}}
        return {"seed": seed, "run_dir": f"runs/{secret}", "threads": 2,
                "memory": {"banks": {"league": bank}},
                "policy": {"optim": {"lr": 1e-3}, "rollout": {"sampling": {"max_new_tokens": 4}}}}

    a, b = run_identity(cfg(0, "hunter2", 0)), run_identity(cfg(0, "rotated9", 0))
    assert "hunter2" not in json.dumps(a) and a == b
    c = run_identity(cfg(1, "hunter2", 1) | {"policy": {"optim": {"lr": 2e-3}}})
    assert differences(a, c) == (
        'seed: 0 there, 1 here; memory.banks.league.url: "redis://127.0.0.1:6379/0?password=" '
        'there, "redis://127.0.0.1:6379/1?password=" here; policy.optim.lr: 0.001 there, 0.002 '
        'here; policy.rollout.sampling.max_new_tokens: 4 there, "unset" here')


def test_a_folder_made_before_a_config_field_existed_resumes_at_its_default(
        train_run, tiny_model_dir, tmp_path, caplog) -> None:
    """An upgrade adds config fields: a run folder whose run.json lacks one resumes when the
    field holds its default (the old code ran as the default does) and is refused, naming it,
    when the resume sets it otherwise."""
    run_dir = copy_run(train_run, tmp_path / "run")
    held = json.loads((run_dir / "run.json").read_text())
    key = "policy.optim.max_grad_norm"  # stands for a field the old agentrt did not have
    assert key in held["fields"]
    del held["fields"][key]
    held["config_sha256"] = "0" * 64
    (run_dir / "run.json").write_text(json.dumps(held))
    with caplog.at_level(logging.WARNING, logger="agentrt"):
        RunDir.open(run_dir, validate_config(train_config(run_dir, tiny_model_dir), TrainConfig)).close()
    assert any(f"before config field(s) {key} existed" in r.getMessage() for r in caplog.records)
    assert key in json.loads((run_dir / "run.json").read_text())["fields"]  # now recorded

    (run_dir / "run.json").write_text(json.dumps(held))  # without the field again
    cfg = train_config(run_dir, tiny_model_dir)
    cfg["policy"].setdefault("optim", {})["max_grad_norm"] = 0.5
    with pytest.raises(RunFolderError, match=f"holds another run \\({key}: \"unset\" there, "
                                             "0.5 here\\)"):
        RunDir.open(run_dir, validate_config(cfg, TrainConfig))


def test_new_run_leaves_no_record_of_the_old_run(train_run, tiny_model_dir, tmp_path) -> None:
    run_dir = copy_run(train_run, tmp_path / "run")
    (run_dir / "notes.txt").write_text("mine")
    (run_dir / "checkpoints" / "step_10.bak").mkdir()
    old = rows(run_dir)
    cfg = train_config(run_dir, tiny_model_dir, seed=1,
                       train={"steps": 2, "prompts_per_step": 2, "group_size": 2})
    proc = cli("train", str(write_yaml(tmp_path / "cfg.yaml", cfg)), "--new-run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    new = rows(run_dir)
    assert [r["step"] for r in new] == [0, 1, 2]
    assert not {r["time"] for r in old} & {r["time"] for r in new}
    assert [p.name for p in RunDir(run_dir).checkpoints()] == ["step_0", "step_1", "step_2"]
    assert json.loads((run_dir / "run.json").read_text())["seed"] == 1
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["seed"] == 1
    assert (run_dir / "notes.txt").read_text() == "mine"  # not the run's: left alone
    assert (run_dir / "checkpoints" / "step_10.bak").is_dir()


def league_records(run_dir: Path) -> dict[str, Any]:
    """What a league run keeps: match records, memory records, metrics (without times)."""
    from agentrt.memory import open_bank

    with closing(sqlite3.connect(run_dir / "matches.sqlite")) as con:
        matches = sorted(con.execute("SELECT match_id, step FROM matches"))
    bank = open_bank({"name": "notes", "backend": "faiss", "embedder": "hashing"}, run_dir)
    try:
        memories = sorted(r.text for r in bank.records())  # (episode ids are random)
    finally:
        bank.close()
    metrics = [{k: v for k, v in r.items() if k != "time" and not k.startswith(("timing_s/",
                                                                                 "perf/"))}
               for r in rows(run_dir)]
    return {"matches": matches, "memories": memories, "metrics": metrics,
            "checkpoints": [p.name for p in RunDir(run_dir).checkpoints()]}


def test_new_run_in_a_tournament_folder_keeps_no_old_match_or_memory(
        league_run, tiny_model_dir, tmp_path) -> None:
    """--new-run in a league folder ends as the same run in an empty folder: the old run's
    match records (steps 1-2), memories and metrics are gone, not mixed in."""
    from agentrt.tournaments.run_config import TournamentRunConfig
    from agentrt.tournaments.trainer import LeagueTrainer

    old = league_records(league_run)
    assert max(s for _, s in old["matches"]) == 2 and old["memories"]

    def cfg(run_dir: Path) -> TournamentRunConfig:
        return validate_config(league_config(run_dir, tiny_model_dir, seed=4,
                                             train={"steps": 1, "games_per_step": 4}),
                               TournamentRunConfig)

    run_dir = copy_run(league_run, tmp_path / "run")
    LeagueTrainer(cfg(run_dir), start="new").run()
    LeagueTrainer(cfg(tmp_path / "fresh")).run()
    new, fresh = league_records(run_dir), league_records(tmp_path / "fresh")
    assert new == fresh
    assert max(s for _, s in new["matches"]) == 1 and new["checkpoints"] == ["step_0", "step_1"]
    assert 0 < len(new["memories"]) < len(old["memories"])


def test_a_second_process_on_a_run_folder_refuses(train_run, tiny_model_dir, tmp_path) -> None:
    run_dir = copy_run(train_run, tmp_path / "run")
    cfg = validate_config(train_config(run_dir, tiny_model_dir), TrainConfig)
    held = RunDir.open(run_dir, cfg)  # this process writes the folder
    try:
        path = write_yaml(tmp_path / "cfg.yaml", train_config(run_dir, tiny_model_dir))
        line = one_error_line(cli("train", str(path)))
        assert f"run folder {run_dir} is in use by another agentrt process (pid {os.getpid()})" \
            in line
        assert (run_dir / ".lock").read_text().strip() == str(os.getpid())  # still ours
    finally:
        held.close()


def test_each_folder_gets_its_own_run_uid_kept_by_resume_and_new_run(
        tiny_model_dir, tmp_path) -> None:
    """run.json's run_uid (what keys a run's records in a shared Redis memory bank): two
    folders of one config get two; a resume, ``--resume force`` and ``--new-run`` keep the
    folder's; a folder made before run_uid existed keeps its config hash's first 16 digits."""
    def uid(folder: Path, start: str = "auto", **extra: Any) -> str:
        cfg = validate_config(train_config(folder, tiny_model_dir, **extra), TrainConfig)
        RunDir.open(folder, cfg, start=start).close()
        return json.loads((folder / "run.json").read_text())["run_uid"]

    a, b = uid(tmp_path / "a"), uid(tmp_path / "b")
    assert a != b and len(a) == 16
    assert uid(tmp_path / "a") == a
    assert uid(tmp_path / "a", "force", seed=5) == a
    assert uid(tmp_path / "a", "new", seed=6) == a
    held = json.loads((tmp_path / "a" / "run.json").read_text())
    del held["run_uid"]
    (tmp_path / "a" / "run.json").write_text(json.dumps(held))
    assert uid(tmp_path / "a", seed=6) == held["config_sha256"][:16]


def test_a_run_refused_before_its_first_checkpoint_does_not_hold_its_folder(
        tiny_model_dir, tmp_path) -> None:
    """Issue 41, finding 11: a LoRA target typo is refused (when the model loads) with one line
    naming the field, not as an agentrt bug; and the folder it leaves (run.json, no checkpoint)
    takes the corrected config instead of refusing it as "another run"."""
    run_dir = tmp_path / "run"
    bad = train_config(run_dir, tiny_model_dir, train={"steps": 1, "prompts_per_step": 2,
                                                       "group_size": 2})
    bad["policy"]["lora"] = {"enabled": True, "target_modules": ["q_proj", "q_projj"]}
    line = one_error_line(cli("train", str(write_yaml(tmp_path / "bad.yaml", bad))))
    assert "lora.target_modules: 'q_projj' is no linear layer of this model" in line
    assert (run_dir / "run.json").is_file() and not RunDir(run_dir).checkpoints()
    good = json.loads(json.dumps(bad))
    good["policy"]["lora"]["target_modules"] = ["q_proj", "v_proj"]
    proc = cli("train", str(write_yaml(tmp_path / "good.yaml", good)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "saved no checkpoint" in proc.stderr and "starting this one over" in proc.stderr
    assert [p.name for p in RunDir(run_dir).checkpoints()] == ["step_0", "step_1"]
