"""``agentrt debug`` (issue 15, must-show 5): the right verdict for three planted bad samples in
real tiny runs, and none for a clean one.

- reward: a run whose reward (a weighted sum of two sources) draws from ``random`` -> its
  episode's verdict is reward;
- leakage: a JSON sample whose prompt is a train-split prompt (as given, and reformatted so only
  the embedding matches) -> leakage; an eval prompt -> no leakage;
- actor: a run whose policy is fine-tuned on one logged response for a few SFT steps between
  its step-1 and step-2 checkpoints -> that episode's verdict is actor;
- clean: an episode of an ordinary run gets no verdict.

Runs are ``agentrt train`` of llama-nano for 1-2 steps (in-process); the report goes through the
real CLI entry point for its text, JSON and one-line errors.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from agentrt.config.load import validate_config
from agentrt.tools.debug import DRIFT_NATS, diagnose
from agentrt.controller.episodes import EpisodeLog
from agentrt.envs.tasks import make_splits
from agentrt.workloads.prompts.workload import PromptWorkload, Trainer
from agentrt.core.types import Trajectory, Turn
from agentrt.workloads.prompts.config import TrainConfig
from test_cli_check import run_cli  # the real entry point, in this process

TASK = {"name": "arithmetic", "train_size": 32, "eval_size": 8, "seed": 5}
REWARDS = textwrap.dedent('''
    import random

    def flaky(prompt, response, info):
        return random.random()
''')


class PlantedDrift(PromptWorkload):
    """After step 2's update, SFT steps on the response of episode s1-0 (before the step-2
    checkpoint): that response's log-prob rises sharply between versions."""

    def after_step(self, ctl: Any, step: int) -> dict[str, float]:
        if step == 2:
            ep = EpisodeLog(self.cfg.run_dir).get("s1-0")
            assert ep is not None
            demo = Trajectory([Turn(ep.prompt_ids, ep.response_ids, [0.0] * len(ep.logprobs))])
            for _ in range(4):
                ctl.sft_step(self.pid, [demo], self.cfg.sft)
        return super().after_step(ctl, step)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrt.policies.models import build_model

    tmp = tmp_path_factory.mktemp("debug")
    model = build_model(tmp / "nano", "llama-nano", seed=0)
    (tmp / "my_rewards.py").write_text(REWARDS)
    sys.path.insert(0, str(tmp))
    try:
        flaky = [{"python": "my_rewards:flaky", "weight": 0.5},  # scored as the run scored
                 {"python": "exact_match", "weight": 0.5}]
        for name, reward, steps in [("clean", "exact_match", 2), ("drift", "exact_match", 2),
                                    ("flaky", flaky, 1)]:
            cfg = validate_config({
                "seed": 0, "run_dir": str(tmp / name), "progress": False, "threads": 1,
                "task": TASK, "reward": reward,
                "policy": {"id": "arith", "model": {"path": str(model)},
                           "rollout": {"sampling": {"max_new_tokens": 4}}},
                "sft": {"lr": 3e-3, "warmup_steps": 0},
                "train": {"steps": steps, "prompts_per_step": 2, "group_size": 2},
                "eval": {"every": 100}, "checkpoint": {"every": 1, "keep": 5}}, TrainConfig)
            trainer = Trainer(cfg)
            if name == "drift":
                trainer.workload = PlantedDrift(cfg)
            trainer.run()
        yield tmp
    finally:
        sys.path.remove(str(tmp))


def test_non_deterministic_reward(runs: Path) -> None:
    report = diagnose(runs / "flaky", "s1-0")
    assert report.verdict == ["reward"]
    reward = report.causes[0]
    assert len(set(reward.data["scores"])) > 1 and "non-deterministic" in reward.summary
    assert "0.5 x python my_rewards:flaky + 0.5 x python exact_match" in reward.evidence[0]


def test_prompt_in_training_data(runs: Path, tmp_path: Path) -> None:
    train, evals = make_splits(TASK["name"], {}, TASK["train_size"], TASK["eval_size"],
                               TASK["seed"])
    ex = train[5]
    spaced = ex.prompt.replace("+", " + ").replace("=", " =")  # only the embedding matches
    for name, prompt, expect in [("exact", ex.prompt, "exact match"),
                                 ("near", spaced, "near-duplicate"),
                                 ("eval", evals[0].prompt, None)]:
        answer = ex.answer if name != "eval" else evals[0].answer
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"prompt": prompt, "response": answer,
                                    "info": {"answer": answer}}))
        report = diagnose(runs / "clean", str(path))
        leak = report.causes[2]
        if expect is None:
            assert report.verdict == [] and not leak.data["in_train"], report.text()
        else:
            assert report.verdict == ["leakage"] and expect in leak.summary, report.text()


def test_actor_drift_between_checkpoints(runs: Path) -> None:
    report = diagnose(runs / "drift", "s1-0")
    assert report.verdict == ["actor"], report.text()
    rows = report.causes[1].data["versions"]
    rises = [r["rise"] for r in rows[1:]]
    assert [r["step"] for r in rows] == [0, 1, 2] and rises[1] > DRIFT_NATS > rises[0]
    assert rows[-1]["kl_k1"] > DRIFT_NATS  # far from the reference too
    # the same prompt's other response, under the same changed weights: no verdict
    other = diagnose(runs / "drift", "s1-1")
    assert other.sample.prompt == report.sample.prompt
    assert other.sample.response != report.sample.response
    assert other.verdict == [] and other.causes[1].data["versions"][-1]["kl_k1"] != 0.0


def test_prompt_in_a_memory_bank(runs: Path, tmp_path: Path) -> None:
    from agentrt.memory.faiss_bank import FaissBank
    from agentrt.memory.config import BankConfig

    run = tmp_path / "run"
    shutil.copytree(runs / "clean", run)
    ex = make_splits(TASK["name"], {}, TASK["train_size"], TASK["eval_size"], TASK["seed"])[1][2]
    with FaissBank(BankConfig(name="notes"), path=run / "memory" / "notes") as bank:
        bank.write("an unrelated note", policy_id="arith")
        bank.write(f"seen before: {ex.prompt}{ex.answer}", policy_id="arith")
    (tmp_path / "s.json").write_text(json.dumps({"prompt": ex.prompt, "response": ex.answer,
                                                 "info": {"answer": ex.answer}}))
    report = diagnose(run, str(tmp_path / "s.json"))
    assert report.verdict == ["leakage"] and "memory bank 'notes'" in report.causes[2].summary
    assert report.causes[2].data["memory_records"] == 2 and not report.causes[2].data["in_train"]


def test_prompt_in_a_preference_data_file(runs: Path, tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"{a}*{a}=", "chosen": str(a * a),
                                         "rejected": str(a)}) + "\n" for a in range(11, 19)))
    cfg = validate_config({
        "run_dir": str(tmp_path / "dpo"), "progress": False, "threads": 1, "task": TASK,
        "policy": {"model": {"path": str(runs / "nano")},
                   "algorithm": {"name": "dpo", "online": False}},
        "data": {"path": str(pairs), "eval_fraction": 0.0},
        "train": {"steps": 1, "prompts_per_step": 2}, "eval": {"every": 100}}, TrainConfig)
    Trainer(cfg).run()
    (tmp_path / "s.json").write_text(json.dumps({"prompt": "13*13=", "response": "169",
                                                 "info": {"answer": "169"}}))
    report = diagnose(tmp_path / "dpo", str(tmp_path / "s.json"))
    assert report.verdict == ["leakage"] and "exact match" in report.causes[2].summary
    assert "data file" in report.causes[2].evidence[0]


def test_prompt_in_a_prompt_file(runs: Path, tmp_path: Path) -> None:
    rows = tmp_path / "prompts.jsonl"  # the first 4 rows are held out for eval
    rows.write_text("".join(json.dumps({"q": f"{a}-{a // 3}=", "a": str(a - a // 3)}) + "\n"
                            for a in range(100, 140)))
    cfg = validate_config({
        "run_dir": str(tmp_path / "file"), "progress": False, "threads": 1,
        "task": {"name": "dataset", "eval_size": 4,
                 "options": {"path": str(rows), "columns": {"prompt": "q", "answer": "a"}}},
        "policy": {"model": {"path": str(runs / "nano")},
                   "rollout": {"sampling": {"max_new_tokens": 2}}},
        "train": {"steps": 1, "prompts_per_step": 2, "group_size": 2}, "eval": {"every": 100}}, TrainConfig)
    Trainer(cfg).run()
    for a, leaked in [(120, True), (101, False)]:
        (tmp_path / "s.json").write_text(json.dumps({
            "prompt": f"{a}-{a // 3}=", "response": "?", "info": {"answer": str(a - a // 3)}}))
        leak = diagnose(tmp_path / "file", str(tmp_path / "s.json")).causes[2]
        assert leak.found is leaked and leak.data["in_eval"] is not leaked, leak.evidence
        assert "36 training rows, 4 held out" in leak.evidence[0]


def test_clean_sample_and_cli_report(runs: Path, monkeypatch, capsys) -> None:
    code, out, err = run_cli(monkeypatch, capsys, "debug", str(runs / "clean"), "s2-3")
    assert code == 0, err
    assert out.splitlines()[0].startswith("verdict: none"), out
    assert [x.split(":")[0] for x in out.splitlines() if not x.startswith(" ")][2:] == [
        "reward", "actor", "leakage"]
    code, out, err = run_cli(monkeypatch, capsys, "debug", str(runs / "drift"), "s1-0", "--json")
    report = json.loads(out)
    assert code == 0 and report["verdict"] == ["actor"]
    assert report["headline"] == diagnose(runs / "drift", "s1-0").headline()
    assert set(report["causes"]) == {"reward", "actor", "leakage"}


@pytest.mark.parametrize("case", ["unknown id", "bad json", "no run", "not json object"])
def test_bad_input_is_one_line(case: str, runs: Path, tmp_path: Path, monkeypatch,
                               capsys) -> None:
    (tmp_path / "bad.json").write_text({"bad json": "{prompt:", "not json object": "[1]"}.get(
        case, "{}"))
    run_dir, sample = {"unknown id": (runs / "clean", "s99-0"),
                       "no run": (tmp_path, "s1-0")}.get(case, (runs / "clean",
                                                                str(tmp_path / "bad.json")))
    code, out, err = run_cli(monkeypatch, capsys, "debug", str(run_dir), sample)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and err.startswith("error: ")
