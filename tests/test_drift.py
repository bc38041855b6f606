"""Drift detection (agentrt.controller.drift, issue 15 must-show 4): a reward changed mid-run to pay for
length is flagged on response length within 20 steps and the configured rollback happens; a run
without change raises no alert over 200 steps (bench/drift.py: the same over 24 seeds, with the
false-alarm rate). Real llama-nano training throughout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agentrt.config.load import validate_config
from agentrt.config.sections import PolicyConfig
from agentrt.config.drift import DriftConfig, SignalTest
from agentrt.controller.drift import compare, ks_2samp, psi, weights_sha256
from agentrt.runtime.pool import LocalPool
from agentrt.rewards import reward
from agentrt.controller.checkpoint import load_checkpoint
from agentrt.workloads.prompts.workload import Trainer
from agentrt.workloads.prompts.config import TrainConfig

DEFAULTS = DriftConfig()  # the drift section's defaults, measured by bench/drift.py


@reward("test_pays_for_length")
def pays_for_length(prompt: str, response: str, info: dict) -> float:
    """The changed reward: characters of the response, whatever they say."""
    return float(len(response))


@pytest.fixture(scope="module")
def nano_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrt.policies.models import build_model

    return build_model(tmp_path_factory.mktemp("models") / "llama-nano", "llama-nano", seed=0)


def config(run_dir: Path, model: Path, steps: int, **drift) -> dict:
    """1-digit additions after a short SFT warm start: a healthy GRPO run, 8 prompts x 4
    samples a step at temperature 1 (the setting of bench/drift.py)."""
    return {"seed": 0, "run_dir": str(run_dir), "progress": False, "threads": 1,
            "task": {"name": "arithmetic", "train_size": 64, "eval_size": 4,
                     "options": {"digits": 1, "ops": ["+"]}},
            "policy": {"model": {"path": str(model)}, "optim": {"lr": 3e-4},
                       "rollout": {"sampling": {"max_new_tokens": 8, "temperature": 1.0}}},
            "sft": {"steps": 100, "batch_size": 16},
            "train": {"steps": steps, "prompts_per_step": 8, "group_size": 4},
            "eval": {"every": 1000}, "checkpoint": {"every": 5, "keep": 2},
            "drift": {"enabled": True, **drift}}


def rows(run_dir: Path, name: str) -> list[dict]:
    path = run_dir / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_tests_flag_a_shift_and_not_the_same_distribution() -> None:
    rng = np.random.default_rng(0)
    ref, same, shifted = rng.normal(size=400), rng.normal(size=200), rng.normal(1.0, 1, 200)
    assert psi(ref, same) < 0.1 < 0.25 < psi(ref, shifted)
    assert ks_2samp(ref, same)[1] > 0.01 and ks_2samp(ref, shifted)[1] < 1e-6
    # integer lengths all equal in the reference: longer and shorter ones both count
    flat = np.full(100, 3.0)
    assert psi(flat, np.full(50, 5.0)) > 1.0 and psi(flat, np.full(50, 2.0)) > 1.0
    assert psi(flat, np.full(50, 3.0)) < 0.01  # (half a count per bin: not exactly 0)
    assert not DEFAULTS.enabled  # off unless asked (bad values: test_bad_input_table.py)
    # an effect size on top: a significant shift of the mean by less than min_change is not
    ref = rng.normal(10.0, 1.0, 4000)
    small = SignalTest(test="ks", min_change=0.05)
    assert compare(SignalTest(test="ks"), ref, rng.normal(10.3, 1.0, 4000))[1]
    assert not compare(small, ref, rng.normal(10.3, 1.0, 4000))[1]
    assert compare(small, ref, rng.normal(11.0, 1.0, 4000))[1]


def test_reward_paying_for_length_is_flagged_and_rolled_back(tmp_path: Path, nano_dir: Path):
    run = tmp_path / "run"
    # the must-show's signal, with its default test: the others flag this change too (reward
    # in 3 steps, token_entropy at times before the length, bench/drift.py), and their alert
    # would roll back first
    length = DEFAULTS.signals["response_length"].model_dump()
    drift = {"action": "rollback", "max_actions": 5, "signals": {"response_length": length}}
    Trainer(validate_config(config(run, nano_dir, 30, **drift), TrainConfig)).run()
    assert rows(run, "drift.jsonl") == []  # no alert before the change
    # the user changes the reward of the running run and continues it at step 30
    changed = config(run, nano_dir, 55, **drift) | {"reward": "test_pays_for_length"}
    Trainer(validate_config(changed, TrainConfig), start="force").run()

    events = rows(run, "drift.jsonl")
    alerts = [e for e in events if e["event"] == "alert"]
    first = alerts[0]
    assert first["signal"] == "response_length" and 30 < first["step"] <= 50, events
    assert first["recent_mean"] > first["reference_mean"] and first["action"] == "rollback"
    rollback = next(e for e in events if e["event"] == "rollback")
    assert rollback["step"] == first["step"]
    # the checkpoint is the newest one from before the first flagged window, and pruning
    # (checkpoint.keep: 2) left it
    good, window = rollback["checkpoint_step"], DEFAULTS.window_steps
    assert good == first["rollback_to"] and good % 5 == 0
    assert first["since_step"] - window - 5 < good <= first["since_step"] - window
    ckpt = run / rollback["checkpoint"]
    assert ckpt.name == f"step_{good}" and ckpt.is_dir()
    assert not (run / "checkpoints" / f"step_{good + 5}").exists()  # an unpinned one was pruned
    # the policy's weights right after the rollback are that checkpoint's, loaded afresh
    pcfg = PolicyConfig.model_validate(changed["policy"])
    pool = LocalPool([pcfg], seed=1, total_steps=55, workdir=tmp_path)
    pool.load_state_dict(load_checkpoint(ckpt)["pools"][pcfg.id])
    expected = weights_sha256(pool.weights(pcfg.id))
    assert rollback["weights_after"] == {pcfg.id: expected}
    assert rollback["weights_before"] != rollback["weights_after"]
    # the metrics say it too: the alert metric at the alert step
    metrics = {r["step"]: r for r in rows(run, "metrics.jsonl")}
    assert metrics[first["step"]]["drift/response_length/alert"] == 1.0
    assert metrics[first["step"] - 1]["drift/response_length/alert"] == 0.0
    print(f"\ndrift: reward changed at step 30, response_length alert at step {first['step']} "
          f"({first['step'] - 30} steps), rolled back to step {good}")


def test_a_run_without_change_raises_no_alert_over_200_steps(tmp_path: Path, nano_dir: Path):
    Trainer(validate_config(config(tmp_path, nano_dir, 200), TrainConfig)).run()
    metrics = rows(tmp_path, "metrics.jsonl")
    checked = [r for r in metrics if "drift/response_length/stat" in r]
    # every step once both windows are full
    assert len(checked) == 200 - DEFAULTS.reference_steps - DEFAULTS.window_steps + 1
    for sig in ("response_length", "token_entropy", "topic", "reward"):
        assert all(r[f"drift/{sig}/alert"] == 0.0 for r in checked), sig
    assert rows(tmp_path, "drift.jsonl") == []
    print(f"\ndrift: 0 alerts in {len(checked)} checked steps x 4 signals (false-alarm rate 0)")


def test_retrain_then_pause_then_resume_accepts(tmp_path: Path, nano_dir: Path, monkeypatch,
                                                capsys) -> None:
    """The actions' mechanics on an alert every comparison (a PSI threshold no sample misses):
    retrain goes back a step and trains it again, the next alert pauses (max_actions 1) with one
    line and exit 2, and the same command resumes and accepts the change."""
    from test_cli_check import run_cli

    cfg = config(tmp_path / "run", nano_dir, 5, reference_steps=2, window_steps=1, patience=1,
                 action="retrain", max_actions=1,
                 signals={"response_length": {"test": "psi", "threshold": 1e-9}})
    cfg |= {"sft": {"steps": 0}, "checkpoint": {"every": 1, "keep": 1}}
    path = tmp_path / "drift.yaml"
    path.write_text(json.dumps(cfg))
    code, _, err = run_cli(monkeypatch, capsys, "train", str(path))
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "step 3: drift on response_length" in lines[0] and "paused (1 of" in lines[0]
    assert "run the same command again to resume" in lines[0]
    events = rows(tmp_path / "run", "drift.jsonl")
    assert [(e["event"], e["step"]) for e in events] == [
        ("alert", 3), ("retrain", 3), ("alert", 3)]
    assert events[0]["action"] == "retrain" and events[2]["action"] == "pause"
    assert events[1]["checkpoint_step"] == 2  # the step before the first flagged window
    # step 3 was trained twice: its first row was replaced, and the pause saved the second
    assert [r["step"] for r in rows(tmp_path / "run", "metrics.jsonl")] == [0, 1, 2, 3]
    assert (tmp_path / "run" / "checkpoints" / "step_3").is_dir()

    code, _, err = run_cli(monkeypatch, capsys, "train", str(path))
    assert code == 0, err
    events = rows(tmp_path / "run", "drift.jsonl")
    assert events[-1]["event"] == "accepted" and events[-1]["step"] == 3
    assert [r["step"] for r in rows(tmp_path / "run", "metrics.jsonl")] == [0, 1, 2, 3, 4, 5]


def test_resume_continues_the_monitor_exactly(tmp_path: Path, nano_dir: Path) -> None:
    """Killed after step 5 and resumed from its step-4 checkpoint, a run logs the drift
    statistics and events of the uninterrupted run (the windows and flags are checkpointed)."""
    def cfg(run: Path) -> dict:
        c = config(run, nano_dir, 9, reference_steps=3, window_steps=2, patience=2,
                   signals={"response_length": {"test": "psi", "threshold": 0.05},
                            "token_entropy": {"test": "ks", "alpha": 0.5},
                            "topic": {"test": "centroid", "alpha": 0.5}})
        return c | {"sft": {"steps": 0}, "checkpoint": {"every": 2, "keep": 1},
                    "train": {"steps": 9, "prompts_per_step": 8, "group_size": 2}}

    Trainer(validate_config(cfg(tmp_path / "a"), TrainConfig)).run()
    Trainer(validate_config(cfg(tmp_path / "b"), TrainConfig)).run(stop_after=5)
    Trainer(validate_config(cfg(tmp_path / "b"), TrainConfig)).run()

    def drift_rows(run: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if k.startswith("drift/")}
                for r in rows(run, "metrics.jsonl")]

    a = drift_rows(tmp_path / "a")
    assert len(a) == 10 and sum(bool(r) for r in a) == 9 - 3 - 2 + 1
    assert drift_rows(tmp_path / "b") == a
    events = rows(tmp_path / "a", "drift.jsonl")
    assert events and rows(tmp_path / "b", "drift.jsonl") == events
