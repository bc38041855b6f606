"""Every example config runs as written, through the CLI a user types, for 1-2 steps.

- ``make demo`` (read from the Makefile) with its output redirected prints step lines with an
  ETA and every greedy evaluation as it comes; its report.html plots the evaluation curve;
- ``agentrt play`` on the demo's tic-tac-toe run, a scripted stdin as the person;
- each file in examples/ with only its run folder, its step counts and (for the cluster
  example) its cluster-only paths and resources overridden.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
AGENTRT = [sys.executable, "-m", "agentrt.cli"]
SHORT_LEAGUE = ["warm_start.steps=2", "warm_start.games_per_step=8", "train.steps=2",
                "train.games_per_step=16", "eval.every=1", "eval.games=8", "threads=1"]


def demo_command() -> list[str]:
    """The command ``make demo`` runs, from the Makefile's recipe."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    recipe = lines[lines.index(next(x for x in lines if x.startswith("demo:"))) + 1]
    words = recipe.strip().split()
    assert words[0] == "$(BIN)/agentrt", recipe
    return [*AGENTRT, *words[1:]]


def run(args: list[str], timeout: int = 900, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``make demo``'s command, shortened to 2 steps, stdout and stderr pipes (not a terminal)."""
    run_dir = tmp_path_factory.mktemp("demo") / "ttt"
    sets = [a for s in SHORT_LEAGUE for a in ("--set", s)]
    return run_dir, run([*demo_command(), *sets, "--run-dir", str(run_dir)])


def test_redirected_demo_shows_steps_eta_and_each_evaluation(demo) -> None:
    run_dir, proc = demo
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    warm = [x for x in lines if x.startswith("warm start lm step ")]
    assert warm and "ETA " in warm[-1] and warm[-1].startswith("warm start lm step 2/2"), lines
    steps = [x for x in lines if re.match(r"league step \d+/2 ", x) and " eval: " not in x]
    assert steps and steps[-1].startswith("league step 2/2") and "ETA " in steps[-1], lines
    # the greedy evaluations at steps 0, 1 and 2, each as it came, against both opponents
    evals = [x for x in lines if " eval: " in x]
    assert [x.split(" eval: ")[0].split()[-1] for x in evals] == ["0/2", "1/2", "2/2"], evals
    assert all("win_rate_vs_random=" in x and "win_rate_vs_minimax=" in x for x in evals)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = next(r for r in reversed(rows) if "eval/win_rate_vs_random" in r)
    assert f"win_rate_vs_random={last['eval/win_rate_vs_random']:.4g}" in evals[-1]
    page = (run_dir / "report.html").read_text()
    assert "<h2>Evaluation curves</h2><img alt='Evaluation curves' src='data:image/png" in page
    assert f"run folder: {run_dir.resolve()}" in page and "<h2>Resolved config</h2>" in page


def test_a_person_plays_the_demo_policy_at_tic_tac_toe(demo) -> None:
    """The person moves first; stdin offers the cells in order, so a taken cell is asked again
    and the next one is tried: every game ends, whatever the policy plays."""
    run_dir, league = demo
    assert league.returncode == 0, league.stderr[-3000:]
    moves = "".join(f"{c}\n" for c in range(9)) * 4
    proc = run([*AGENTRT, "play", str(run_dir), "--games", "2"], input=moves, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    results = [x for x in out.splitlines() if x.startswith("game ")]
    assert len(results) == 2, out
    assert re.search(r"of 2 games, drew \d+$", out.rstrip()), out[-500:]
    assert "your move" in out


EXAMPLE_RUNS = {
    # file: (command, overrides)
    "arith_grpo.yaml": ("train", ["sft.steps=2", "train.steps=1", "train.prompts_per_step=4",
                                  "train.group_size=2", "task.eval_size=8"]),
    "arith_grpo_service.yaml": ("train", ["sft.steps=2", "train.steps=2",
                                          "train.prompts_per_step=4", "train.group_size=2",
                                          "task.eval_size=4"]),
    "arith_grpo_drift.yaml": ("train", [
        "sft.steps=2", "train.steps=3", "train.prompts_per_step=4", "train.group_size=2",
        "task.eval_size=4", "drift.reference_steps=1", "drift.window_steps=1"]),
    "arith_grpo_control.yaml": ("train", ["sft.steps=2", "train.steps=2",
                                          "train.prompts_per_step=4", "train.group_size=2",
                                          "task.eval_size=4"]),
    "arith_dpo.yaml": ("train", ["sft.steps=2", "train.steps=1", "train.prompts_per_step=4",
                                 "task.eval_size=8"]),
    "grpo_parquet.yaml": ("train", ["sft.steps=2", "train.steps=2", "train.prompts_per_step=4",
                                    "train.group_size=2", "task.eval_size=4"]),
    "ttt_ppo_dpo.yaml": ("tournament run", SHORT_LEAGUE),
    "bargain_roles.yaml": ("tournament run", SHORT_LEAGUE),
    "kuhn3_league.yaml": ("tournament run", [*SHORT_LEAGUE, "train.games_per_step=12",
                                             "eval.games=6"]),
    "kuhn_league.yaml": ("tournament run", SHORT_LEAGUE),
    "ttt_selfplay.yaml": ("tournament run", SHORT_LEAGUE),
    "game_league.yaml": ("tournament run", SHORT_LEAGUE),
    # Leduc's exact NashConv costs ~15 s a policy (the Kuhn example runs the same measure)
    "leduc_league.yaml": ("tournament run", [*SHORT_LEAGUE, "eval.exploitability=off"]),
    "bargain_exploiter.yaml": ("tournament run", [
        *SHORT_LEAGUE, "eval.every=2", "eval.exploiter.every=2", "eval.exploiter.steps=1",
        "eval.exploiter.games_per_step=8", "eval.exploiter.games=8"]),
    "recall_memory_league.yaml": ("tournament run", ["train.steps=2", "train.games_per_step=8",
                                                     "eval.every=1", "eval.games=8"]),
    "decompose_wordchain.yaml": ("decompose run", [
        "sft.steps=2", "policies.0.sft_steps=2", "train.steps=1", "train.tasks_per_step=4",
        "train.group_size=2", "eval.size=4", "family.train_size=50", "family.eval_size=4"]),
    "decompose_shopping.yaml": ("decompose run", [
        "sft.steps=2", "train.steps=1", "train.tasks_per_step=4", "train.group_size=2",
        "eval.size=4", "family.train_size=50", "family.eval_size=4"]),
    "ttt_eval.yaml": ("tournament eval", ["schedule.rounds=1", "schedule.games_per_pairing=2"]),
    "cluster/grpo_cluster.yaml": ("train", [
        "runtime.address=null", "policy.resources.num_workers=2",
        "policy.resources.cpus_per_worker=1", "policy.resources.gpus_per_worker=0",
        "train.steps=1", "train.prompts_per_step=4", "train.group_size=2", "task.eval_size=8",
        "eval.every=1", "checkpoint.every=1"]),
    # in this process: the Ray run of a cluster config is the one above (and tests/test_multinode.py)
    "cluster/league_cluster.yaml": ("tournament run", [
        *SHORT_LEAGUE, "runtime.backend=local", "runtime.address=null",
        *(f"policies.{i}.resources.{k}" for i in (0, 1)
          for k in ("num_workers=1", "cpus_per_worker=1", "gpus_per_worker=0"))]),
    "cluster/decompose_cluster.yaml": ("decompose run", [
        "sft.steps=2", "policies.0.sft_steps=2", "train.steps=1", "train.tasks_per_step=4",
        "train.group_size=2", "eval.size=4", "family.train_size=50", "family.eval_size=4",
        "runtime.backend=local", "runtime.address=null",
        *(f"policies.{i}.resources.gpus_per_worker=0" for i in (0, 1, 2))]),
}


def test_every_example_config_is_run_here() -> None:
    """The demo's config runs in the fixture, the plugin package's league in test_plugins.py,
    every other one below (cluster/raycluster.yaml is a KubeRay manifest, not a config)."""
    found = {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.yaml")
             if "plugin_pkg" not in p.parts and "apiVersion:" not in p.read_text()}
    demo_config = next(Path(w) for w in demo_command() if w.endswith(".yaml"))
    assert found == {*EXAMPLE_RUNS, str(demo_config.relative_to("examples"))}


@pytest.mark.parametrize("name", sorted(EXAMPLE_RUNS))
def test_example_runs_as_written(name: str, demo, tiny_model_dir, tmp_path: Path,
                                 request) -> None:
    command, overrides = EXAMPLE_RUNS[name]
    overrides = [*overrides, "progress=false"]
    if name == "ttt_eval.yaml":  # rates the demo's policy: what the example names, elsewhere
        demo_dir, league = demo
        assert league.returncode == 0, league.stderr[-3000:]
        overrides.append(f"policies.0.model.path={demo_dir / 'final_models' / 'lm'}")
    if name.startswith("cluster/"):  # shared storage and a cluster's model: this machine's
        data = yaml.safe_load((EXAMPLES / name).read_text())
        overrides += ([f"policy.model.path={tiny_model_dir}"] if "policy" in data else
                      [f"policies.{i}.model.path={tiny_model_dir}"
                       for i in range(len(data["policies"]))])
    if name == "grpo_parquet.yaml":  # the file examples/make_prompts_parquet.py writes, smaller
        proc = run([sys.executable, "examples/make_prompts_parquet.py", "--rows", "300",
                    "--out", str(tmp_path / "prompts.parquet")])
        assert proc.returncode == 0, proc.stderr
        overrides.append(f"task.options.path={tmp_path / 'prompts.parquet'}")
    if name == "arith_grpo_service.yaml":  # the reward service the example's comment starts
        server = subprocess.Popen([sys.executable, "examples/reward_server.py", "--port", "0"],
                                  cwd=ROOT, stdout=subprocess.PIPE, text=True)
        request.addfinalizer(server.kill)
        url = server.stdout.readline().split()[-1]
        overrides.append(f"reward.0.http={url}")
    where = ([] if command == "tournament eval" else ["--run-dir", str(tmp_path / "run")])
    sets = [a for s in overrides for a in ("--set", s)]
    if command == "tournament eval":
        sets += ["--set", f"run_dir={tmp_path / 'run'}"]
    proc = run([*AGENTRT, *command.split(), str(EXAMPLES / name), *sets, *where])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "run" / "config.yaml").exists(), sorted((tmp_path / "run").iterdir())
