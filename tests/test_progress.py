"""Progress when output is redirected: plain lines with step and ETA, every evaluation shown."""

from __future__ import annotations

import io

from agentrt.controller.progress import StepProgress


def test_redirected_progress_prints_steps_eta_and_every_evaluation() -> None:
    out = io.StringIO()
    bar = StepProgress(3, label="train", every_s=0.0, stream=out)
    bar.update(1, {"reward/mean": 0.25})
    bar.update(2, {"reward/mean": 0.5, "eval/accuracy": 0.75, "eval/reward": 0.5})
    bar.update(3, {"reward/mean": 1.0})
    bar.close()
    lines = out.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == [
        "train step 1/3", "train step 2/3", "train step 2/3 eval: accuracy=0.75", "train step 3/3"]
    assert all("ETA " in line and "s/step" in line for line in lines if "eval:" not in line)
    assert lines[2] == "train step 2/3 eval: accuracy=0.75  reward=0.5"
    assert lines[3].endswith("reward=1  accuracy=0.75")  # the latest evaluation stays in view


def test_lines_are_rate_limited_but_evaluations_and_the_end_always_show() -> None:
    out = io.StringIO()
    bar = StepProgress(4, label="league", every_s=3600.0, stream=out)
    for step in range(1, 5):
        bar.update(step, {"eval/win_rate_vs_random": 0.5} if step == 2 else {})
    lines = out.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == [
        "league step 2/4", "league step 2/4 eval: win_rate_vs_random=0.5", "league step 4/4"]


def test_the_step_0_evaluation_is_shown_without_a_step_line() -> None:
    out = io.StringIO()
    bar = StepProgress(5, label="train", every_s=0.0, stream=out)
    bar.update(0, {"eval/accuracy": 0.0, "sft/loss": 2.0})
    assert out.getvalue() == "train step 0/5 eval: accuracy=0\n"


def test_disabled_progress_prints_nothing() -> None:
    out = io.StringIO()
    bar = StepProgress(3, enabled=False, stream=out)
    bar.update(1, {"eval/accuracy": 1.0})
    assert out.getvalue() == ""
