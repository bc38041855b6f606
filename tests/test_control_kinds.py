"""Online control and the episode log for every run kind (must-show 4 of "The house"): a real
``agentrt tournament run`` (tic-tac-toe) and a real ``agentrt decompose run`` (word chains)
process on llama-nano each start paused, are told to pause again before step 2 and resumed,
refuse what does not apply to them (inject, feedback) in one line, take a live temperature
through ``agentrt ctl set policies.0.rollout.sampling.temperature=0.5`` while they hold, are
resumed and finish. Their metrics row of step 2 says the change applied, their episode log
holds the turns they trained on (the new temperature from step 2), and ``agentrt debug`` gives
a verdict on one of them. What stays unsupported is refused by ``check-config`` in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrt.controller.control.client import send
from agentrt.controller.episodes import EpisodeLog
from test_cli_check import run_cli  # the real entry point, in this process
from test_control import ctl, wait_for

STEPS, PAUSE = 3, 2
KEY = "policies.0.rollout.sampling.temperature"
CONTROL = {"enabled": True, "start_paused": True}


@pytest.fixture(scope="module")
def nano(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrt.policies.models import build_model

    return build_model(tmp_path_factory.mktemp("models") / "nano", "llama-nano", seed=0)


def league(run: Path, model: Path) -> dict[str, Any]:
    return {"seed": 0, "run_dir": str(run), "progress": False, "threads": 1,
            "envs": [{"id": "TicTacToe-v0", "template": {"history": False}}],
            "policies": [{"id": "lm", "model": {"path": str(model)},
                          "rollout": {"sampling": {"max_new_tokens": 3, "top_k": 10}}}],
            "baselines": [{"id": "random", "kind": "random", "seed": 1}],
            "train": {"steps": STEPS, "games_per_step": 4}, "eval": {"every": 100, "games": 2},
            "checkpoint": {"every": 100}, "control": CONTROL}


def decompose(run: Path, model: Path) -> dict[str, Any]:
    return {"seed": 0, "run_dir": str(run), "progress": False, "threads": 1,
            "family": {"name": "wordchain", "train_size": 20, "eval_size": 2, "seed": 5},
            "planner": {"kind": "rule", "max_subtasks": 4},
            "policies": [{"id": "solver", "model": {"path": str(model)},
                          "skills": ["parse", "add", "sub", "mul", "div", "format"],
                          "rollout": {"sampling": {"max_new_tokens": 4}}}],
            "train": {"steps": STEPS, "tasks_per_step": 2, "group_size": 2},
            "eval": {"every": 100, "size": 2}, "checkpoint": {"every": 100}, "control": CONTROL}


def drive(tmp: Path, command: list[str], config: dict[str, Any]) -> dict[str, Any]:
    """Runs ``agentrt COMMAND CONFIG`` in a process and drives it with ``agentrt ctl``."""
    run = Path(config["run_dir"])
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "AGENTRT_CTL_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "agentrt.cli", *command, str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rec: dict[str, Any] = {}
    try:
        wait_for("control.json", lambda: (run / "control.json").is_file(), proc)
        rec["pause"] = ctl(str(run), "pause", "--at-step", str(PAUSE))
        rec["resume_start"] = ctl(str(run), "resume")
        wait_for(f"the pause before step {PAUSE}", lambda: (
            (s := send(run, None))["paused"] and s["next_step"] == PAUSE), proc)
        rec["inject"] = ctl(str(run), "inject", "2+2=", "--answer", "4")
        rec["feedback"] = ctl(str(run), "feedback", "s1-0", "1.0")
        rec["set"] = ctl(str(run), "set", f"{KEY}=0.5")
        rec["resume"] = ctl(str(run), "resume")
        rec["rc"] = proc.wait(timeout=300)
        rec["stderr"] = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    rec["metrics"] = {row["step"]: row for row in map(
        json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    rec["episodes"] = list(EpisodeLog(run))
    return rec


@pytest.fixture(scope="module", params=["league", "decompose"])
def kind(request: pytest.FixtureRequest, nano: Path,
         tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp(request.param)
    run = tmp / "run"
    if request.param == "league":
        return request.param, run, drive(tmp, ["tournament", "run"], league(run, nano))
    return request.param, run, drive(tmp, ["decompose", "run"], decompose(run, nano))


def test_pause_live_temperature_and_resume(kind) -> None:
    name, run, rec = kind
    assert rec["rc"] == 0, rec["stderr"][-3000:]
    for step in ("pause", "resume_start", "set", "resume"):
        assert rec[step][0] == 0, (step, rec[step])
    assert not (run / "control.json").exists()  # the endpoint ends with the run
    assert rec["metrics"][PAUSE][f"control/set/{KEY}"] == 0.5
    assert not any(k.startswith("control/") for k in rec["metrics"][1])
    assert sorted(rec["metrics"]) == list(range(STEPS + 1))


def test_inject_and_feedback_are_refused_in_one_line(kind) -> None:
    name, _, rec = kind
    for command in ("inject", "feedback"):
        code, out, err = rec[command]
        assert code == 2 and out == "" and len(err.splitlines()) == 1, rec[command]
        assert err.startswith(f"error: {command} is refused: "), err


def test_the_episode_log_holds_the_trained_turns_under_stable_ids(kind) -> None:
    name, _, rec = kind
    episodes = rec["episodes"]
    assert {e.step for e in episodes} == set(range(1, STEPS + 1))
    pid = "lm" if name == "league" else "solver"
    agents = ("player_0", "player_1") if name == "league" else ("a0", "a1", "a2", "a3")
    for e in episodes:
        step, index, agent, turn = e.id[1:].split("-")
        assert (int(step), int(index), agent, int(turn)) == (e.step, e.idx, e.info["agent"],
                                                            e.info["turn"])
        assert agent in agents and e.policy_id == pid and e.prompt and e.prompt_ids
        assert len(e.logprobs) == len(e.response_ids)
        assert e.sampling["temperature"] == (0.5 if e.step >= PAUSE else 1.0)
    assert len({e.id for e in episodes}) == len(episodes)


def test_debug_gives_a_verdict_on_a_logged_turn(kind, monkeypatch, capsys) -> None:
    _, run, rec = kind
    sample = rec["episodes"][-1].id
    code, out, err = run_cli(monkeypatch, capsys, "debug", str(run), sample)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("verdict: none"), out
    causes = {x.split(":")[0]: x for x in lines if not x.startswith(" ")}
    assert causes["reward"].startswith("reward: ok: does not apply: ")
    assert causes["leakage"].startswith("leakage: ok: does not apply: ")
    assert causes["actor"].startswith("actor: ok: ")


@pytest.mark.parametrize("config", [league, decompose])
def test_async_rollout_is_refused_by_check_config(config, tmp_path: Path, nano: Path,
                                                  monkeypatch, capsys) -> None:
    cfg = config(tmp_path / "run", nano)
    cfg["train"]["async_rollout"] = {"enabled": True}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code, out, err = run_cli(monkeypatch, capsys, "check-config", str(path))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "train.async_rollout.enabled is not supported in this kind of run: " in err
