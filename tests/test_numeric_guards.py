"""Numeric guards (agentrt.controller.guards): poison in the config is refused before any work, and a run
whose rewards or updates fail stops with one line, exit code 2, and its last checkpoint intact."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from agentrt.config.sections import GuardsConfig
from agentrt.controller.guards import RunGuard, RunStopped, nonfinite_tensors
from agentrt.rewards import score
from agentrt.controller.checkpoint import load_checkpoint
from agentrt.controller.run_dir import RunDir

AGENTRT = [sys.executable, "-m", "agentrt.cli"]
PROMPTS, GROUP, EVAL = 4, 2, 4

# Good (digit share) for the step-0 evaluation and the samples of step 1, then poisoned: step 1
# trains and is checkpointed, step 2 must stop the run.
REWARDS = textwrap.dedent(f"""
    GOOD_CALLS = {EVAL + PROMPTS * GROUP}
    calls = 0

    def _poisoned(value):
        def reward(prompt, response, info):
            global calls
            calls += 1
            if calls <= GOOD_CALLS:
                return sum(c.isdigit() for c in response) / max(1, len(response))
            if value == "raise":
                raise RuntimeError("reward service down")
            return float(value)
        return reward

    nan_reward = _poisoned("nan")
    huge_reward = _poisoned(1e300)
    raising_reward = _poisoned("raise")
""")


def agentrt(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENTRT, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("kind, patch, field", [
    ("train", {"policy": {"optim": {"lr": math.inf}}}, "policy.optim.lr"),
    ("train", {"policy": {"optim": {"betas": [0.9, math.nan]}}}, "policy.optim.betas.1"),
    ("train", {"policy": {"optim": {"lr": 50.0}}}, "policy.optim.lr"),
    ("train", {"policy": {"algorithm": {"entropy_coef": -math.inf}}},
     "policy.algorithm.entropy_coef"),
    ("tournament", {"envs": [{"id": "TicTacToe-v0"}], "baselines": [{"id": "random"}],
                    "policies": [{"id": "lm"}], "runner": {"invalid_penalty": math.nan}},
     "runner.invalid_penalty"),
])
def test_non_finite_or_absurd_config_values_are_one_line_naming_the_field(tmp_path, kind,
                                                                          patch, field):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), **patch}))
    assert ".inf" in path.read_text() or ".nan" in path.read_text() or "50.0" in path.read_text()
    proc = agentrt("check-config", str(path), "--kind", kind, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert field in lines[0] and ("finite" in lines[0] or "less than" in lines[0]), lines[0]


def test_infinite_lr_never_starts_a_run(tmp_path):
    path = tmp_path / "lr.yaml"
    path.write_text("run_dir: run\npolicy: {optim: {lr: .inf}}\n")
    proc = agentrt("train", str(path), cwd=tmp_path)
    assert proc.returncode == 2
    assert error_lines(proc) == ["error: invalid config: policy.optim.lr: Input should be a "
                                 "finite number (got inf)"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("reward", ["nan_reward", "huge_reward", "raising_reward"])
def test_failing_reward_stops_the_run_with_its_last_checkpoint_intact(tmp_path, tiny_model_dir,
                                                                     reward):
    (tmp_path / "bad_rewards.py").write_text(REWARDS)
    run = tmp_path / "run"
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({
        "imports": ["bad_rewards"], "run_dir": str(run), "progress": False,
        "reward": f"bad_rewards:{reward}",
        "task": {"name": "arithmetic", "train_size": 50, "eval_size": EVAL},
        "policy": {"model": {"path": str(tiny_model_dir)}, "optim": {"lr": 1e-3},
                   "rollout": {"sampling": {"max_new_tokens": 4}}},
        "train": {"steps": 3, "prompts_per_step": PROMPTS, "group_size": GROUP},
        "eval": {"every": 100}, "checkpoint": {"every": 1, "keep": 5}}))
    proc = agentrt("train", str(tmp_path / "cfg.yaml"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    [line] = error_lines(proc)
    assert line.startswith("error: step 2: the reward failed on 100% of the samples"), line
    assert "guards.max_reward_error_rate=0.5" in line
    assert "the checkpoint of step 1 is kept" in line
    latest = RunDir(run).checkpoints()[-1]
    assert latest.name == "step_1"
    state = load_checkpoint(latest)
    assert int(state["step"]) == 1
    weights = [t for t in _tensors(state) if t.is_floating_point()]
    assert weights and list(nonfinite_tensors(state)) == []


def _tensors(state):
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, dict):
        for v in state.values():
            yield from _tensors(v)
    elif isinstance(state, (list, tuple)):
        for v in state:
            yield from _tensors(v)


def test_absurd_and_non_finite_rewards_are_failed_samples():
    samples = [("p", "r", {})]
    for value in (math.nan, math.inf, -math.inf, 1e300, -2e9):
        assert score(lambda p, r, i, v=value: v, samples) == ([0.0], 1)
    assert score(lambda p, r, i: -1e9, samples) == ([-1e9], 0)


def test_skipped_updates_in_a_row_stop_and_a_good_step_resets_the_count():
    guard = RunGuard(GuardsConfig(max_skipped_steps=2))
    guard.saved(4)
    guard.check_updates(5, {"lm": {"actor/skipped": 1.0}})
    guard.check_updates(6, {"lm": {"actor/skipped": 0.5}})  # one optimizer step went through
    guard.check_updates(7, {"lm": {"actor/skipped": 1.0}, "other": {}})
    with pytest.raises(RunStopped, match=r"step 8: every update of policy 'lm' was skipped .* "
                                         r"2 steps in a row .*checkpoint of step 4 is kept"):
        guard.check_updates(8, {"lm": {"actor/skipped": 1.0}})
    RunGuard(GuardsConfig(max_skipped_steps=None)).check_updates(1, {"lm": {"actor/skipped": 1.0}})


def test_a_state_with_nan_weights_is_never_checkpointed(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    state = {"step": 3, "pools": {"lm": {"model": model.state_dict()}}}
    guard = RunGuard(GuardsConfig())
    guard.check_state(3, state)  # finite: fine
    name = next(iter(model.state_dict()))
    with torch.no_grad():
        model.state_dict()[name].view(-1)[0] = float("nan")
    with pytest.raises(RunStopped, match=f"step 3: pools.lm.model.{name} holds NaN or inf"):
        guard.check_state(3, state)
