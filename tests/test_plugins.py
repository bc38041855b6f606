"""Plugins (agentrt.core.plugins): examples/plugin_pkg brings its own env, scripted player, task and
reward, and `agentrt tournament run` and `agentrt train` use them from YAML alone."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "plugin_pkg"
AGENTRT = [sys.executable, "-m", "agentrt.cli"]


def agentrt(*args: str, cwd: Path, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """The real CLI in a fresh process, run from ``cwd`` (not the repo: nothing on sys.path)."""
    return subprocess.run([*AGENTRT, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=600)


def test_scripted_player_task_and_reward_behave(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGIN))
    from agentrt.policies.scripted import RandomPolicy
    from agentrt.runner.core import EpisodeRunner, specs
    from nim_plugin.task import nim_optimal

    assert nim_optimal("", " 1", {"stones": 13}) == 1.0  # leaves 12
    assert nim_optimal("", "2", {"stones": 13}) == 0.0
    assert nim_optimal("", "3", {"stones": 12}) == 0.5  # no winning move: any legal take
    assert nim_optimal("", "3", {"stones": 2}) == 0.0  # more than the pile
    from nim_plugin.players import OptimalNim

    runner = EpisodeRunner({"perfect": OptimalNim(seed=0), "random": RandomPolicy(seed=0)})
    records = runner.run(specs("Nim-v0", ("perfect", "random"), 200)).episodes
    wins = sum(r.returns[next(a for a, p in r.seats.items() if p == "perfect")] > 0
               for r in records)
    assert wins >= 190  # 15 stones: the mover at a non-multiple of 4 wins with perfect play


@pytest.fixture(scope="module")
def nim_league(tmp_path_factory: pytest.TempPathFactory
               ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A short league run on the plugin's game: (run folder, the finished command)."""
    tmp = tmp_path_factory.mktemp("nim")
    run = tmp / "run"
    proc = agentrt("tournament", "run", str(PLUGIN / "nim_league.yaml"), "--run-dir", str(run),
                   "--set", "policies.0.model.preset=llama-nano", "--set", "train.steps=2",
                   "--set", "train.games_per_step=8", "--set", "warm_start.steps=10",
                   "--set", "warm_start.games_per_step=8", "--set", "warm_start.lr=3e-3",
                   "--set", "eval.games=4", cwd=tmp)
    return run, proc


def test_league_with_the_plugin_from_yaml_alone(nim_league) -> None:
    """The scripted player is a league opponent (module:Class) and the warm-start teacher (its
    registered name); imports: finds the package beside the YAML."""
    run, proc = nim_league
    assert proc.returncode == 0, proc.stderr
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["imports"] == ["nim_plugin"] and saved["warm_start"]["teacher"] == "optimal-nim"
    assert saved["import_paths"] == [str(PLUGIN.resolve())]
    assert saved["policies"][0]["algorithm"]["advantage"] == "rae"  # Nim says it is zero-sum
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert "sft/loss" in first  # the teacher's moves were cloned
    assert "eval/win_rate_vs_perfect" in first
    with sqlite3.connect(run / "matches.sqlite") as db:
        envs = {e for (e,) in db.execute("SELECT DISTINCT env FROM matches")}
        perfect = db.execute("SELECT COUNT(*) FROM seats WHERE policy_id = 'perfect'").fetchone()
    assert envs == {"Nim-v0"} and perfect[0] > 0
    # Redirected output: a line per step with its ETA, and every evaluation as it comes.
    evals = [line for line in proc.stderr.splitlines() if " eval: " in line]
    assert [line.split(" eval: ")[0].split()[-1] for line in evals] == ["0/2", "2/2"]
    assert all("win_rate_vs_perfect=" in line for line in evals)
    assert any("step 2/2" in line and "ETA" in line for line in proc.stderr.splitlines())
    page = (run / "report.html").read_text()  # names the run, plots evaluations, embeds config
    assert f"run folder: {run.resolve()}" in page
    assert "<h2>Evaluation curves</h2><img alt='Evaluation curves' src='data:image/png" in page
    assert "<h2>Resolved config</h2>" in page and "teacher: optimal-nim" in page


def test_a_person_plays_the_trained_policy(nim_league, tmp_path: Path) -> None:
    """agentrt play: the person (a scripted stdin, always taking 1) plays first against the
    league's policy, in the terminal, until the game ends."""
    run, league = nim_league
    assert league.returncode == 0, league.stderr
    # no PYTHONPATH: the run's saved config names the folder its imports came from (issue 41)
    proc = subprocess.run([*AGENTRT, "play", str(run), "--games", "2"], input="1\n" * 40,
                          capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("Nim: 15 stones left.") == 2  # each game starts with the person to move
    assert "your move (1 2 3): " in out
    moves = re.findall(r"lm plays: (\S+)", out)
    assert moves and set(moves) <= {"1", "2", "3"}, out  # every policy move is shown
    results = [line for line in out.splitlines() if line.startswith("game ")]
    assert len(results) == 2 and all(" you " in line for line in results), out
    assert out.rstrip().endswith("of 2 games, drew 0")


def test_tournament_eval_rates_the_trained_policy_by_opponent_and_seat(nim_league,
                                                                      tmp_path: Path) -> None:
    """A rating-only tournament of the league's final model and the perfect player: no random
    baseline or eval section needed; win/draw/loss per opponent and seat are printed."""
    run, league = nim_league
    assert league.returncode == 0, league.stderr
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({
        "imports": ["nim_plugin"], "run_dir": str(tmp_path / "eval"), "envs": [{"id": "Nim-v0"}],
        "policies": [{"id": "lm", "model": {"path": str(run / "final_models" / "lm")}}],
        "baselines": [{"id": "perfect", "kind": "optimal-nim"}],
        "schedule": {"format": "round_robin", "rounds": 2, "games_per_pairing": 4}}))
    proc = subprocess.run([*AGENTRT, "tournament", "eval", str(config)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PLUGIN)})
    assert proc.returncode == 0, proc.stderr
    rows = {tuple(x.split()[:3]): x.split()[3] for x in proc.stdout.splitlines()
            if x.startswith("lm ") and len(x.split()) == 8}  # player opponent seat games ...
    assert rows == {("lm", "perfect", "0"): "4", ("lm", "perfect", "1"): "4",
                    ("lm", "perfect", "all"): "8"}, proc.stdout


def test_train_with_the_plugin_task_and_reward(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = agentrt("train", str(PLUGIN / "nim_train.yaml"), "--run-dir", str(run),
                   "--set", "policy.model.preset=llama-nano", "--set", "train.steps=2",
                   "--set", "train.prompts_per_step=4", "--set", "train.group_size=2",
                   "--set", "sft.steps=1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    scored = [r for r in rows if "reward/mean" in r]
    assert len(scored) == 2 and all(r["reward/errors"] == 0 for r in scored)
    assert "eval/reward" in rows[-1]
    evals = [line for line in proc.stderr.splitlines() if " eval: " in line]
    assert len(evals) == 2 and all("accuracy=" in line for line in evals), proc.stderr  # 0, 2


CONFIG = textwrap.dedent("""
    envs: [{id: Nim-v0}]
    policies: [{id: lm, model: {preset: llama-nano}}]
    baselines: [{id: random}, {id: perfect, kind: optimal-nim}]
""")


def test_import_option_and_entry_point(tmp_path: Path) -> None:
    """Without imports: the names are unknown; --import, or an installed distribution's
    agentrt.core.plugins entry point, makes them resolve."""
    config = tmp_path / "nim.yaml"
    config.write_text(CONFIG)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PLUGIN)}
    proc = agentrt("check-config", str(config), cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "unknown env 'Nim-v0'" in proc.stderr
    proc = agentrt("check-config", str(config), "--import", "nim_plugin", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "# first prompt of lm (Nim-v0 as player_0)" in proc.stdout  # the plugin env's
    proc = agentrt("check-config", str(config), "--import", "nim_plugn", cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "imports: cannot import 'nim_plugn'" in proc.stderr
    # What `pip install examples/plugin_pkg` leaves in site-packages: the package's metadata
    # with its entry point (read by importlib.metadata, as for any installed distribution).
    dist = tmp_path / "site" / "agentrt_nim_plugin-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: agentrt-nim-plugin\n"
                                   "Version: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[agentrt.core.plugins]\nnim = nim_plugin\n")
    env["PYTHONPATH"] = f"{PLUGIN}:{tmp_path / 'site'}"
    proc = agentrt("check-config", "--no-prompt", str(config), cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr


def test_env_and_player_by_module_and_class(tmp_path: Path) -> None:
    """'package.module:Class' names an env and a scripted player without registering them; the
    env's zero_sum flag still picks RAE."""
    config = tmp_path / "nim.yaml"
    by_class = "kind: 'nim_plugin.players:OptimalNim'"
    config.write_text(CONFIG.replace("Nim-v0", "nim_plugin.env:Nim")
                      .replace("kind: optimal-nim", by_class))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PLUGIN)}
    proc = agentrt("check-config", str(config), cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "advantage: rae" in proc.stdout


def test_match_format_from_the_plugin(tmp_path: Path) -> None:
    """schedule.format names the plugin's gauntlet by its path (no registration needed): the
    learner meets the two baselines in turn; a path to nothing is one line at check time."""
    run = tmp_path / "run"
    proc = agentrt("tournament", "run", str(PLUGIN / "nim_league.yaml"), "--run-dir", str(run),
                   "--set", "policies.0.model.preset=llama-nano", "--set", "train.steps=2",
                   "--set", "train.games_per_step=8", "--set", "warm_start.steps=0",
                   "--set", "eval.games=4", "--set", "schedule.format=nim_plugin.schedule:gauntlet",
                   cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PLUGIN)})
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(run / "matches.sqlite") as db:
        rivals = [p for (p,) in db.execute(
            "SELECT policy_id FROM seats WHERE policy_id != 'lm' ORDER BY match_id")]
    assert rivals == ["random", "perfect"] * 8  # 2 steps x 8 games, one opponent after the other
    bad = agentrt("check-config", str(PLUGIN / "nim_league.yaml"),
                  "--set", "schedule.format=nim_plugin.schedule:nothing", cwd=tmp_path,
                  env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PLUGIN)})
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith("error: ") and "schedule.format" in bad.stderr
    assert "'nim_plugin.schedule' has no function 'nothing'" in bad.stderr


def test_plugin_league_on_ray(tmp_path: Path) -> None:
    """The same plugin league with its policy in a Ray actor pool: the driver imports the
    plugin (envs, players, rewards run there), the workers only hold the model."""
    run = tmp_path / "run"
    proc = agentrt("tournament", "run", str(PLUGIN / "nim_league.yaml"), "--run-dir", str(run),
                   "--set", "policies.0.model.preset=llama-nano", "--set", "train.steps=2",
                   "--set", "train.games_per_step=8", "--set", "warm_start.steps=2",
                   "--set", "eval.games=4", "--set", "runtime.backend=ray", cwd=tmp_path,
                   env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PLUGIN)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    with sqlite3.connect(run / "matches.sqlite") as db:
        played = db.execute("SELECT COUNT(*), MIN(env), MAX(env) FROM matches").fetchone()
    assert played == (16, "Nim-v0", "Nim-v0")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and "actor/loss" in rows[-1]
