"""Preference runs end to end with a real tiny model: learning on the built-in arithmetic
preferences, every loss through the trainer, online DPO from rollouts, resume, bad rows."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from test_trainer import rows, small_config  # also registers the test rewards

from agentrt.config.load import validate_config
from agentrt.workloads.prompts.workload import Trainer
from agentrt.workloads.prompts.config import TrainConfig

_GEN = Path(__file__).parents[1] / "examples" / "data" / "make_arith_prefs.py"
_spec = importlib.util.spec_from_file_location("make_arith_prefs", _GEN)
make_arith_prefs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_arith_prefs)
make_rows = make_arith_prefs.make_rows


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and do not fight other processes for cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_rows(path: Path, data: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in data))
    return path


def pref_config(run_dir: Path, model_dir: Path, data: Path, **over) -> dict:
    cfg = small_config(run_dir, model_dir, **{
        "reward": "exact_match", "task.options": {"digits": 1}, "task.eval_size": 32,
        "data": {"path": str(data), "max_length": 32, "eval_fraction": 0.25},
        "policy.algorithm": {"name": "dpo", "beta": 0.1},
        "policy.optim": {"lr": 2e-3, "warmup_steps": 2},
        "train.steps": 6, "train.prompts_per_step": 16, "eval.every": 100})
    for key, value in over.items():
        node = cfg
        *path, last = key.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = value
    return cfg


def test_dpo_on_arithmetic_preferences_learns_held_out_pairs(tmp_path, tiny_model_dir):
    """bench/dpo_arith.py in small: 2-digit sums, a short SFT warm start, then DPO (+ NLL)."""
    data = write_rows(tmp_path / "pairs.jsonl", make_rows(1000, "pairwise", 0, 2, 1234, 64))
    cfg = validate_config(pref_config(tmp_path / "run", tiny_model_dir, data, **{
        "task.options": {"digits": 2}, "task.eval_size": 64, "data.eval_fraction": 0.15,
        "sft.steps": 200, "sft.batch_size": 64, "train.steps": 40, "train.prompts_per_step": 64,
        "eval.every": 10, "policy.algorithm": {"name": "dpo", "beta": 0.5,
                                               "chosen_nll_coef": 1.0},
        "policy.optim": {"lr": 5e-4, "warmup_steps": 5}}), TrainConfig)
    Trainer(cfg).run()
    log = rows(tmp_path / "run")
    start, end = log[0], log[-1]
    assert abs(start["eval/pref_accuracy"] - 0.5) < 0.05  # policy == reference
    # The held-out accuracy oscillates at this lr (0.65, 0.72, 0.75, 0.65 at steps 10-40 in one
    # run; a last point at 0.65 moved to 0.63-0.65 with fp32 rounding changes): the mean of the
    # evaluations after step 0 is the steadier figure, the last must stay well above chance
    # (bench/dpo_arith.py: >= 0.9 with more steps).
    accs = [r["eval/pref_accuracy"] for r in log if "eval/pref_accuracy" in r][1:]
    assert sum(accs) / len(accs) >= 0.65 and end["eval/pref_accuracy"] >= 0.6, (accs, end)
    # Held-out generation accuracy is not asserted: after this short SFT it is 2-7 correct answers
    # of 64 and moves by noise (it failed here on 2026-12-03 going 3/64 -> 2/64 while every
    # preference figure improved). The held-out margin grows with training instead.
    margins = [r["eval/pref_margin"] for r in log if "eval/pref_margin" in r]
    # policy == reference at step 0, to float32 rounding (packed rows differ in the last bits)
    assert abs(margins[0]) < 1e-6 and 0.0 < margins[1] < margins[-1], margins
    assert end["pref/margin"] > 0 and end["pref/chosen_reward"] > end["pref/rejected_reward"]


@pytest.mark.parametrize("algorithm", ["ipo", "kto", "listwise"])
def test_every_preference_loss_trains_through_the_trainer(tmp_path, tiny_model_dir, algorithm):
    data = write_rows(tmp_path / "lists.jsonl", make_rows(120, "listwise", 0, 1, 1234, 32))
    cfg = validate_config(pref_config(tmp_path, tiny_model_dir, data, **{
        "policy.algorithm": {"name": algorithm, "beta": 0.5}, "train.steps": 8}), TrainConfig)
    Trainer(cfg).run()
    log = [r for r in rows(tmp_path) if "actor/loss" in r]
    assert len(log) == 8 and all(r["actor/skipped"] == 0 for r in log)
    first, last = log[0], log[-1]
    assert first["pref/accuracy"] == pytest.approx(0.5, abs=0.05)
    assert last["pref/margin"] > first["pref/margin"] + 0.05, (first, last)
    assert (tmp_path / "final_model" / "config.json").is_file()


def test_online_dpo_raises_the_reward(tmp_path, tiny_model_dir):
    cfg = validate_config(small_config(tmp_path, tiny_model_dir, **{
        "policy.algorithm": {"name": "dpo", "online": True, "beta": 0.5},
        "policy.optim.lr": 2e-3}), TrainConfig)
    Trainer(cfg).run()
    log = [r for r in rows(tmp_path) if "reward/mean" in r]
    r = [row["reward/mean"] for row in log]
    assert len(r) == 12 and all(row["pref/pairs"] > 0 for row in log)
    start, end = sum(r[:3]) / 3, sum(r[-3:]) / 3
    assert end > start + 0.1, f"online dpo: reward {start:.3f} -> {end:.3f}"


def test_resume_and_malformed_rows(tmp_path, tiny_model_dir, caplog):
    good = make_rows(80, "pairwise", 0, 1, 1234, 32)
    bad = [{"prompt": "1+1="}, {"prompt": "1+1=", "chosen": "", "rejected": "3"},
           {"prompt": "1+1=", "chosen": "2", "rejected": "2"},
           {"prompt": "9" * 40, "chosen": "2", "rejected": "3"}, "]["]
    data = write_rows(tmp_path / "pairs.jsonl", good[:40] + bad + good[40:])

    def cfg(d):
        return validate_config(pref_config(d, tiny_model_dir, data, **{
            "train.steps": 5, "checkpoint.every": 2, "sft.steps": 2, "sft.batch_size": 8,
            "policy.algorithm": {"name": "dpo", "online": False, "beta": 0.1},
            "policy.optim.schedule": "cosine"}), TrainConfig)

    with caplog.at_level("WARNING", logger="agentrt.runtime.preference"):
        Trainer(cfg(tmp_path / "a")).run()
    (line,) = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert "skipped 5 of 85 rows" in line
    Trainer(cfg(tmp_path / "b")).run(stop_after=3)  # as if killed after step 3 (ckpt at 2)
    Trainer(cfg(tmp_path / "b")).run()
    a, b = rows(tmp_path / "a"), rows(tmp_path / "b")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 3, 4, 5]
    for ra, rb in zip(a[3:], b[3:]):
        for key in ("actor/loss", "actor/grad_norm", "pref/margin", "pref/kl", "actor/lr"):
            assert rb[key] == pytest.approx(ra[key], abs=1e-6), (ra["step"], key)
