"""bench/decomposer.py at toy size (one RL step per arm, one seed), so the bench cannot rot: two
families' arms (the shopping family's no-tool arm too; eventplan's arms are wordchain's) train
on the same held-out tasks of the chosen split, the raw JSON keeps every task's outcome per arm
and seed, and the interval over seeds and tasks is computed from them; four trained candidates
are routed fixed and by the router (issue 40; the interval's resampling of several seeds is
checked on its own below)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "decomposer.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_decomposer", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_runs_every_arm_of_every_family_for_each_seed(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--families", "wordchain", "shopping",
         "--seeds", "1", "--split", "validation", "--sft-samples", "640", "--rl-steps",
         "1", "--tasks-per-step", "2", "--eval-size", "6", "--planner-steps", "1",
         "--planner-sft-steps", "1", "--out", str(tmp_path / "runs"), "--json",
         str(tmp_path / "raw.json"), "--shares", "wordchain:reader=0.5,calc=0.5",
         "--routing", "--routing-steps", "1", "--routing-sft-samples", "640"],
        capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    raw = json.loads((tmp_path / "raw.json").read_text())
    assert raw["commit"] and raw["args"]["split"] == "validation"
    arms = {"wordchain": {"decomposer", "generalist"},
            "shopping": {"decomposer", "no-tool", "generalist"}}
    for family, runs in raw["runs"].items():
        assert len(runs) == 1 and all(set(run) == arms[family] for run in runs)
        tasks = set(runs[0]["generalist"]["outcomes"])
        assert len(tasks) == 6  # every held-out chain kept, the same tasks for every arm and seed
        for run in runs:
            assert all(set(run[arm]["outcomes"]) == tasks for arm in arms[family])
            sft = {arm: run[arm]["samples"][0] for arm in arms[family]}
            assert sft["generalist"] == 640 and 0 < sft["decomposer"] <= 640
        mean, lo, hi = raw["summary"][family]["decomposer - generalist"]
        assert lo <= mean <= hi
    shop = (tmp_path / "runs" / "shopping_decomposer_seed1" / "config.yaml").read_text()
    assert "lookup_tool" in shop and "looker" not in shop
    no_tool = (tmp_path / "runs" / "shopping_no-tool_seed1" / "config.yaml").read_text()
    assert "lookup_tool" not in no_tool and "looker" in no_tool
    assert "SFT split of wordchain: {'reader': 0.5, 'calc': 0.5}" in out.stdout
    assert "decomposer - no-tool" in out.stdout and "LM planner" in out.stdout
    # routing among trained candidates: the four candidates trained once, then frozen and
    # routed fixed (two of them) or by the router (all four, learning from one step of chains)
    [routing] = raw["routing"]
    assert set(routing) == {"fixed 1", "fixed 2", "ratings", "ratings+memory"}
    assert all(set(arm["outcomes"]) == tasks for arm in routing.values())
    for name, arm in routing.items():
        cfg = yaml.safe_load((Path(arm["run_dir"]) / "config.yaml").read_text())
        ids = [p["id"] for p in cfg["policies"]]
        assert not any(p["trainable"] for p in cfg["policies"])
        assert ids == (["reader1", "calc1"] if name == "fixed 1" else ["reader2", "calc2"]
                       if name == "fixed 2" else ["reader1", "reader2", "calc1", "calc2"])
        assert cfg["router"]["memory"] == (name == "ratings+memory")
        assert cfg["train"]["steps"] == (0 if name.startswith("fixed") else 1)
    assert "ratings+memory - ratings" in raw["summary"]["routing"]
    # the candidates' run is a warm start only (0 steps): its evaluation, report and weights
    trained = tmp_path / "runs" / "routing_candidates_seed1"
    assert (trained / "report.html").exists() and (trained / "final" / "calc2").is_dir()


def test_the_interval_resamples_seeds_and_tasks() -> None:
    crossed = _bench().crossed_interval
    same = [{"t0": True, "t1": False}, {"t0": False, "t1": True}]
    assert crossed(same, same) == (0.0, 0.0, 0.0)
    right = [dict.fromkeys(("t0", "t1", "t2"), True)] * 3
    wrong = [dict.fromkeys(("t0", "t1", "t2"), False)] * 3
    assert crossed(right, wrong) == (1.0, 1.0, 1.0)
    # one seed at +1 on every task, two at 0: seeds vary, so the interval is wide
    a = [dict.fromkeys(map(str, range(50)), True)] + [dict.fromkeys(map(str, range(50)), False)] * 2
    b = [dict.fromkeys(map(str, range(50)), False)] * 3
    mean, lo, hi = crossed(a, b, reps=500)
    assert abs(mean - 1 / 3) < 1e-9 and lo == 0.0 and hi == 1.0


def test_arms_can_be_run_alone_and_are_compared_only_among_those_run() -> None:
    # --arms decomposer compares SFT splits on the validation split without the generalist
    bench = _bench()
    assert bench.arms_of("shopping") == ("decomposer", "no-tool", "generalist")
    assert bench.arms_of("eventplan") == ("decomposer", "generalist")
    assert bench.arms_of("shopping", ["generalist", "decomposer"]) == ("decomposer", "generalist")
    assert bench.arms_of("eventplan", ["no-tool"]) == ()
    run = {arm: {"success": 0.5, "outcomes": {"t0": True, "t1": False}}
           for arm in ("decomposer", "no-tool")}
    out = bench.summarize("shopping", [run, run])
    assert out["decomposer"] == [0.5, 0.5] and "generalist" not in out
    assert set(k for k in out if " - " in k) == {"decomposer - no-tool"}
