"""``agentrt decompose run`` end to end on word chains: the controller loop, real torch training.

- must-show 5: bad plans (unparseable, unknown subtask, cycle, over budget, a planner that
  raises) and a specialist that raises are recorded outcomes with reasons, and the run goes on:
  an untrained LM planner's garbage, scripted bad plans through the workload's own episode
  runner set-up, and a Python specialist raising in a run that still trains its LM specialist;
- must-show 6: ``agentrt decompose run`` killed with SIGKILL mid-run, then the same command,
  ends with exactly the chains, metrics, evaluations and weights of an uninterrupted run;
- the command surface: a bad config is one ``error:`` line naming the field (exit 2), and
  ``agentrt decompose report RUN_DIR`` rewrites the report.

Python specialists live in ``decompose_tools.py`` next to this file: ``calc`` does every
word-chain step right, ``odd_format`` raises on an odd number. The LM specialist ``reader``
shares ``parse`` with ``calc`` and (untrained) always fails it; under ``on_failure: repair`` the
step's retry may go to ``calc``, so ``reader``'s failed attempt still gets its share of the
chain's outcome, which varies (solved, or ``odd_format`` raised): a real learning signal.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from agentrt.config.load import load_config, validate_config
from agentrt.decomposer.config import DecomposeConfig
from agentrt.decomposer.workload import Decomposer, DecomposeWorkload, chain_metrics, chain_of
from agentrt.controller.checkpoint import load_checkpoint
from agentrt.core.errors import ConfigError
from agentrt.controller.run_dir import RunDir
from agentrt.runner.core import EpisodeRunner

HERE = Path(__file__).parent
AGENTRT = [sys.executable, "-m", "agentrt.cli"]
TASKS, GROUP = 4, 2
CHAINS = TASKS * GROUP  # chains per step
CALC = {"id": "calc", "fn": "decompose_tools:calc", "skills": ["parse", "add", "sub", "mul", "div"]}
ODD_FORMAT = {"id": "odd_format", "fn": "decompose_tools:odd_format", "skills": ["format"]}


def lm(pid: str, model_dir: Path, skills: list[str], max_new_tokens: int) -> dict[str, Any]:
    return {"id": pid, "model": {"path": str(model_dir)}, "skills": skills,
            "optim": {"lr": 1e-3}, "rollout": {"sampling": {"max_new_tokens": max_new_tokens}}}


def tool_config(run_dir: Path, model_dir: Path, steps: int = 4, **over: Any) -> dict[str, Any]:
    """Rule planner; ``reader`` (LM) and ``calc`` share parse, ``calc`` does the arithmetic,
    ``odd_format`` formats (and raises on odd numbers). Epsilon routing keeps sending some
    parse steps to ``reader`` after the ratings have separated, so it trains all through the run."""
    cfg = {
        "seed": 0, "run_dir": str(run_dir), "progress": False, "threads": 1,
        "family": {"name": "wordchain", "train_size": 200, "eval_size": 10, "seed": 5},
        "planner": {"kind": "rule", "max_subtasks": 4},
        "policies": [lm("reader", model_dir, ["parse"], 10)],
        "tools": [CALC, ODD_FORMAT],
        "router": {"exploration": "epsilon", "epsilon": 0.5},
        "chain": {"on_failure": "repair", "repairs": 1},
        "sft": {"steps": 2, "batch_size": 8},
        "train": {"steps": steps, "tasks_per_step": TASKS, "group_size": GROUP},
        "eval": {"every": 100, "size": 10},
        "checkpoint": {"every": 2, "keep": 10},
    }
    for key, value in over.items():
        node = cfg
        *path, last = key.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = value
    return cfg


def planner_config(run_dir: Path, model_dir: Path) -> dict[str, Any]:
    """An (untrained) LM planner; ``calc`` does every subtask right."""
    return {
        "seed": 0, "run_dir": str(run_dir), "progress": False, "threads": 1,
        "family": {"name": "wordchain", "train_size": 200, "eval_size": 10, "seed": 5},
        "planner": {"kind": "lm", "policy": "planner", "max_subtasks": 4, "token_budget": 40},
        "policies": [lm("planner", model_dir, [], 24)],
        "tools": [{**CALC, "skills": CALC["skills"] + ["format"]}],
        "train": {"steps": 2, "tasks_per_step": TASKS, "group_size": GROUP},
        "eval": {"every": 100, "size": 4},
        "checkpoint": {"every": 100},
    }


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def model_of(ckpt: Path, pid: str) -> dict[str, torch.Tensor]:
    return load_checkpoint(ckpt)["pools"][pid]["policies"][pid]["model"]


def assert_same(a: Any, b: Any, where: str = "state") -> None:
    """``a`` equals ``b`` exactly, tensors included (nested dicts, lists, tuples)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and np.array_equal(a, b), where
    else:
        assert a == b, (where, a, b)


def not_timing(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row without wall-clock values (time, timing_s/, perf/)."""
    return {k: v for k, v in row.items()
            if k != "time" and not k.startswith(("timing_s/", "perf/"))}


@pytest.fixture(scope="module")
def tool_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A finished 4-step run of :func:`tool_config` (shared by the must-show 5 and report
    tests)."""
    run_dir = tmp_path_factory.mktemp("decompose") / "tools"
    Decomposer(validate_config(tool_config(run_dir, tiny_model_dir), DecomposeConfig)).run()
    return run_dir


def test_a_failed_step_is_retried_by_another_specialist(tool_run: Path) -> None:
    """``chain.retry_with: other`` (the default): under ``on_failure: repair`` the retry of a
    step goes to a specialist that has not failed it, when one has the skill."""
    chains = read_jsonl(tool_run / "chains.jsonl") + [
        c for e in read_jsonl(tool_run / "eval_chains.jsonl") for c in e["chains"]]
    retries = [(a["policy"], b["policy"]) for c in chains
               for a, b in zip(c["steps"], c["steps"][1:]) if a["step"] == b["step"]]
    assert ("reader", "calc") in retries  # reader fails parse; calc does it right
    # only odd_format formats: its failed tries can only go back to it
    assert ("odd_format", "odd_format") in retries
    assert all(first != again or first == "odd_format" for first, again in retries), \
        Counter(retries)


# ---------------------------------------------------------------------- must-show 5
def test_specialist_that_raises_is_an_outcome_and_the_run_trains_on(tool_run: Path) -> None:
    chains = read_jsonl(tool_run / "chains.jsonl")
    assert [c["chain_id"] for c in chains] == [f"{s}:{i}" for s in range(1, 5)
                                              for i in range(CHAINS)]
    raised = [c for c in chains if "specialist raised" in c["reason"]]
    assert raised, Counter(c["outcome"] for c in chains)
    for c in raised:
        assert c["outcome"] == "subtask_failed" and not c["success"]
        assert c["reason"].startswith("format (step 3): specialist raised: ValueError: "
                                      "cannot format odd"), c["reason"]
        last = c["steps"][-1]
        assert (last["type"], last["policy"], last["ok"]) == ("format", "odd_format", False)
        assert last["reason"].startswith("specialist raised: ValueError")
    assert any(c["outcome"] == "solved" for c in chains)  # other chains went through
    assert {c["step"] for c in raised} != {1}, "the raising specialist was only met once"

    rows = read_jsonl(tool_run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # the run reached its last step
    for r in rows[1:]:
        outcomes = {k: v for k, v in r.items() if k.startswith("decompose/outcome/")}
        mine = [c for c in chains if c["step"] == r["step"]]
        assert outcomes == {f"decompose/outcome/{k}": n / CHAINS
                            for k, n in Counter(c["outcome"] for c in mine).items()}
        # reader (the only LM) is updated exactly in the steps where it played a parse step
        played = any(s["policy"] == "reader" for c in mine for s in c["steps"])
        assert played == ({"actor/loss", "actor/grad_norm"} <= set(r)), (r["step"], played)
    # Epsilon routing keeps sending parse steps to reader after calc's rating has pulled ahead
    # (a step without one is a 0.75**8 draw): it did, and failed, parse steps all through the run
    reader_steps = {c["step"] for c in chains for s in c["steps"] if s["policy"] == "reader"}
    assert len(reader_steps) >= 3 and max(reader_steps) >= 3, reader_steps
    # A step whose reader attempts all got the same outcome share has no GRPO signal (zero
    # advantages); the others do.
    assert any(r.get("actor/grad_norm", 0) > 0 for r in rows[1:])
    assert "eval/success" in rows[-1] and "eval/outcome/subtask_failed" in rows[-1]
    ckpts = {int(p.name.split("_")[1]): p for p in RunDir(tool_run).checkpoints()}
    start, end = model_of(ckpts[0], "reader"), model_of(ckpts[4], "reader")
    changed = [k for k in start if not torch.equal(start[k], end[k])]
    assert changed, "the RL steps did not change the LM specialist's weights"
    final = load_file(tool_run / "final" / "reader" / "model.safetensors")
    assert final.keys() <= end.keys() and all(torch.equal(final[k], end[k]) for k in final)


def test_untrained_lm_planner_writes_unparseable_plans_the_run_goes_on(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    Decomposer(validate_config(planner_config(tmp_path, tiny_model_dir), DecomposeConfig)).run()
    chains = read_jsonl(tmp_path / "chains.jsonl")
    assert len(chains) == 2 * CHAINS and {c["step"] for c in chains} == {1, 2}
    for c in chains:
        assert c["outcome"] == "bad_plan" and not c["plan_valid"] and c["steps"] == []
        assert c["planner"] == "planner"
        assert c["reason"].startswith(f"{c['plan_error']}: ") and len(c["reason"]) > 20
    assert Counter(c["plan_error"] for c in chains)["unparseable"] > CHAINS
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert r["decompose/plan_valid"] == 0.0 and r["decompose/outcome/bad_plan"] == 1.0
        assert "actor/loss" in r  # the planner was trained on its (zero-reward) plans
    assert rows[-1]["eval/outcome/bad_plan"] == 1.0


BAD_PLANS = {  # task index -> (plan the scripted planner writes, outcome, reason starts with)
    0: ("first parse, then multiply!", "bad_plan", "unparseable: not a chain"),
    1: ("parse > sqrt > format", "bad_plan", "unknown_subtask: unknown subtask type 'sqrt'"),
    2: ("a=parse(c); b=mul(a); c=sub(b); d=format(c)", "bad_plan",
        "cycle: steps parse -> mul -> sub"),
    3: ("parse > add > add > add > format", "bad_plan",
        "over_budget: 5 steps; at most 4 allowed"),
    4: ("parse > parse > parse > format", "bad_plan",
        "over_budget: the steps may spend 42 tokens; the budget is 40"),
    5: ("", "bad_plan", "planner raised: RuntimeError: planner crashed"),
    6: (None, "solved", ""),  # the rule plan: this chain goes through beside the bad ones
}


def test_bad_plans_of_every_kind_are_outcomes_through_the_workload_runner(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    """The planner seat of the run's own episodes (specs, runner settings, router) bound to a
    scripted planner: a config can only name an LM planner, which cannot be told what to write."""
    work = DecomposeWorkload(validate_config(planner_config(tmp_path, tiny_model_dir),
                                             DecomposeConfig))
    tasks = work.train_tasks
    plans = {work.family.planner_prompt(tasks[i]): work.family.rule_plan(tasks[i]).text
             if plan is None else plan for i, (plan, _, _) in BAD_PLANS.items()}

    def planner(req: Any) -> str:
        if not plans[req.observation]:
            raise RuntimeError("planner crashed")
        return plans[req.observation]

    specs = work.specs("train", list(BAD_PLANS), 1)
    assert all(s.players[0] == "planner" for s in specs)
    runner = EpisodeRunner({"planner": planner} | work.tools, work.runner,
                           route=work.seat_router())
    chains = [chain_of(r) for r in runner.run(specs).episodes]
    assert [c["task_id"] for c in chains] == [tasks[i].id for i in BAD_PLANS]
    for c, (plan, outcome, reason) in zip(chains, BAD_PLANS.values()):
        assert (c["outcome"], c["success"]) == (outcome, outcome == "solved"), c
        assert c["reason"].startswith(reason), (c["reason"], reason)
        assert c["plan_valid"] == (outcome == "solved")
        if plan:
            assert c["plan"] == plan.strip()
    assert all(c["steps"] == [] for c in chains[:-1])
    assert [s["policy"] for s in chains[-1]["steps"]] == ["calc"] * 4
    m = chain_metrics(chains, "decompose")
    assert m["decompose/outcome/bad_plan"] == pytest.approx(6 / 7)
    assert m["decompose/plan_valid"] == pytest.approx(1 / 7)


# ---------------------------------------------------------------------- must-show 6
KILL_STEPS = 8


def kill_config(run_dir: Path, model_dir: Path) -> dict[str, Any]:
    # Checkpoints every 2 steps: between one and the next the run has recorded chains and
    # metrics of a step the checkpoint does not hold, which the resume must drop and redo.
    return tool_config(run_dir, model_dir, steps=KILL_STEPS, **{
        "checkpoint": {"every": 2, "keep": 2},
        "router": {"exploration": "epsilon", "epsilon": 0.5, "memory": True}})


def recorded_steps(path: Path) -> set[int]:
    steps = set()
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                steps.add(json.loads(line)["step"])
            except (json.JSONDecodeError, KeyError):
                pass  # a line being written
    return steps


def latest_step(run_dir: Path) -> int:
    ckpts = RunDir(run_dir).checkpoints()
    return int(ckpts[-1].name.split("_")[1]) if ckpts else -1


def tools_env() -> dict[str, str]:
    """The environment of a subprocess run: ``decompose_tools`` importable."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])}


def start_run(cfg_path: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(AGENTRT + ["decompose", "run", str(cfg_path)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=tools_env(), start_new_session=True)


def test_killed_run_resumes_to_the_uninterrupted_chains_and_weights(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    killed_dir, ref_dir = tmp_path / "killed", tmp_path / "reference"
    cfg_path = tmp_path / "decompose.yaml"
    cfg_path.write_text(yaml.safe_dump(kill_config(killed_dir, tiny_model_dir)))
    killed = start_run(cfg_path, tmp_path / "killed.log")
    resumed = None
    try:
        def mid_run() -> bool:  # past a checkpoint >= 2, with chains of a later step recorded
            ckpt = latest_step(killed_dir)
            return 2 <= ckpt < KILL_STEPS and max(
                recorded_steps(killed_dir / "chains.jsonl"), default=-1) > ckpt

        deadline = time.monotonic() + 120
        while not mid_run() and killed.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        log = (tmp_path / "killed.log").read_text
        assert killed.poll() is None, f"the run ended before the kill:\n{log()[-3000:]}"
        assert mid_run(), f"no checkpoint >= 2 in 120 s:\n{log()[-3000:]}"
        os.killpg(killed.pid, signal.SIGKILL)
        assert killed.wait(30) == -signal.SIGKILL
        ckpt = latest_step(killed_dir)
        ahead = max(recorded_steps(killed_dir / "chains.jsonl"))
        assert ckpt < ahead, f"killed at checkpoint {ckpt} with no chains past it"
        at_kill = model_of(RunDir(killed_dir).checkpoints()[-1], "reader")

        # The same command again, and meanwhile the uninterrupted reference in this process.
        resumed = start_run(cfg_path, tmp_path / "resumed.log")
        Decomposer(load_config(cfg_path, [f"run_dir={ref_dir}"], model=DecomposeConfig)).run()
        out = (tmp_path / "resumed.log").read_text
        assert resumed.wait(300) == 0, out()[-3000:]
    finally:
        for proc in (killed, resumed):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert f"resumed from {killed_dir / 'checkpoints' / f'step_{ckpt}'}" in out()
    print(f"killed after checkpoint {ckpt} with chains of step {ahead} recorded")

    # Every chain of steps 1..N exactly once, in the reference's order and content.
    a, b = read_jsonl(ref_dir / "chains.jsonl"), read_jsonl(killed_dir / "chains.jsonl")
    ids = [f"{s}:{i}" for s in range(1, KILL_STEPS + 1) for i in range(CHAINS)]
    assert [c["chain_id"] for c in b] == ids == [c["chain_id"] for c in a]
    assert [(c["step"], c["task_id"]) for c in b] == [(c["step"], c["task_id"]) for c in a]
    assert b == a  # plans, routing, LM outputs, verdicts and outcomes too
    # Metrics rows per step once; every value but wall-clock equal.
    ra, rb = read_jsonl(ref_dir / "metrics.jsonl"), read_jsonl(killed_dir / "metrics.jsonl")
    assert [r["step"] for r in rb] == list(range(KILL_STEPS + 1)) == [r["step"] for r in ra]
    assert [not_timing(r) for r in rb] == [not_timing(r) for r in ra]
    assert read_jsonl(killed_dir / "eval_chains.jsonl") == read_jsonl(ref_dir / "eval_chains.jsonl")
    # The last checkpoint in full: weights, optimizer and scheduler, RNG states, version, the
    # task sampler and the router (ratings, counts, rng, history, memory records).
    sa, sb = (load_checkpoint(RunDir(d).checkpoints()[-1]) for d in (ref_dir, killed_dir))
    assert sb["step"] == sa["step"] == KILL_STEPS
    for state in (sa, sb):  # memory records carry a random id and the wall-clock time of writing
        router = state["workload"]["router"]
        router["memory"] = [{k: v for k, v in r.items() if k not in ("id", "time")}
                            for r in router["memory"]]
    assert_same(sb, sa)
    # not vacuous: the resumed steps changed the weights
    final_b = sb["pools"]["reader"]["policies"]["reader"]["model"]
    assert any(not torch.equal(v, final_b[k]) for k, v in at_kill.items())
    fa, fb = (load_file(d / "final" / "reader" / "model.safetensors") for d in (ref_dir,
                                                                                killed_dir))
    assert fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa)


# ---------------------------------------------------------------------- command surface
@pytest.mark.parametrize(("patch", "expected"), [
    ({"tools": [CALC]}, "no policy or tool has a skill for subtask type 'format'"),
    ({"planner": {"kind": "lm"}}, "planner.policy must name one of the policies for kind: lm"),
    ({"family": {"name": "wordsoup"}}, "family.name: "),
    ({"policies": [{**lm("reader", Path("m"), ["parse"], 10), "sft_match": "bags (of"}]},
     "policies.0.sft_match"),
], ids=["no-skill-for-a-type", "lm-planner-without-policy", "unknown-family", "bad-sft-match"])
def test_bad_config_is_one_error_line_naming_the_field(
        tmp_path: Path, tiny_model_dir: Path, monkeypatch, capsys, patch: dict,
        expected: str) -> None:
    from agentrt.cli import main

    run_dir = tmp_path / "run"
    cfg = tool_config(run_dir, tiny_model_dir) | patch
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    monkeypatch.setattr(sys, "argv", ["agentrt", "decompose", "run", str(path)])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: invalid config") and \
        expected in err, err
    assert not run_dir.exists()  # nothing started


def test_report_command_rewrites_the_report(tool_run: Path, tmp_path: Path, monkeypatch,
                                           capsys) -> None:
    from agentrt.cli import main

    report = tool_run / "report.html"
    report.unlink()
    proc = subprocess.run([*AGENTRT, "decompose", "report", str(tool_run)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"report: {report}"
    text = report.read_text()
    assert "<h2>Routing matrix" in text and "<h2>Held-out success" in text
    assert "<h2>Example chains" in text and "specialist raised" in text
    for kind in ("parse", "format"):
        assert f"<td>subtask {kind}</td>" in text
    for pid in ("reader", "calc", "odd_format"):
        assert f"<th>{pid}</th>" in text
    monkeypatch.setattr(sys, "argv", ["agentrt", "decompose", "report", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_:
        main()  # not a run folder
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err == f"error: {tmp_path} has no chains.jsonl; is it a " \
                                            "decomposer run folder?"


def test_sft_match_warm_starts_a_specialist_on_its_slice_only(tmp_path: Path,
                                                               tiny_model_dir: Path) -> None:
    """Two readers of the same types, each warm-started on the rows of its own templates: every
    row a reader gets matches its pattern, together they get every row, and a pattern that
    matches no row is refused naming the field before any training."""
    one, two = "bags of|shares them|away and buys", "rows of|finds|loses"
    readers = [{**lm("reader1", tiny_model_dir, ["parse", "format"], 10), "sft_match": one},
               {**lm("reader2", tiny_model_dir, ["parse", "format"], 10), "sft_match": two}]
    cfg = validate_config(tool_config(tmp_path / "run", tiny_model_dir, policies=readers),
                          DecomposeConfig)
    work = DecomposeWorkload(cfg)
    rows = work.demonstration_rows()
    everything = [obs for task in work.train_tasks for who, obs, _ in
                  work.family.demonstrations(task) if who in ("parse", "format")]
    assert rows["reader1"] and rows["reader2"]
    assert all(re.search(one, ex.prompt) and not re.search(two, ex.prompt)
               for ex in rows["reader1"])
    assert all(re.search(two, ex.prompt) for ex in rows["reader2"])
    assert sorted(ex.prompt for r in rows.values() for ex in r) == sorted(everything)

    nothing = [{**readers[0], "sft_match": "^mul "}, readers[1]]  # reader1 has no mul rows
    cfg = validate_config(tool_config(tmp_path / "run2", tiny_model_dir, policies=nothing),
                          DecomposeConfig)
    with pytest.raises(ConfigError, match=r"policies\.0\.sft_match: '\^mul ' matches no"):
        DecomposeWorkload(cfg).demonstration_rows()
