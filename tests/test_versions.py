"""Policy versions (agentrt.controller.versions): every checkpointed version and league snapshot has a
record, and ``agentrt policies ls|show|diff`` read them. Two real ``agentrt train`` runs differ
in config (lr), data (the task's seed) and reward source (two reward functions of one module);
``diff`` names each difference."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrt.controller.versions import diff, provenance, read_versions, source_sha
from agentrt.controller.checkpoint import sha256_of

AGENTRT = [sys.executable, "-m", "agentrt.cli"]
REWARDS = textwrap.dedent('''
    def exact(prompt, response, info):
        return float(response.strip() == info["answer"])

    def starts(prompt, response, info):
        return float(response.strip()[:1] == info["answer"][:1])
''')


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENTRT, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(cwd)})


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir) -> Path:
    tmp = tmp_path_factory.mktemp("versions")
    (tmp / "my_rewards.py").write_text(REWARDS)
    for name, reward, seed, lr in [("a", "exact", 1, 1e-4), ("b", "starts", 2, 3e-4)]:
        (tmp / f"{name}.yaml").write_text(textwrap.dedent(f"""
            run_dir: {tmp / name}
            progress: false
            threads: 1
            task: {{name: arithmetic, train_size: 64, eval_size: 8, seed: {seed}}}
            reward: my_rewards:{reward}
            policy:
              id: arith
              model: {{path: {tiny_model_dir}}}
              rollout: {{sampling: {{max_new_tokens: 4}}}}
              optim: {{lr: {lr}}}
            train: {{steps: 2, prompts_per_step: 4, group_size: 2}}
            eval: {{every: 1}}
            checkpoint: {{every: 1}}
        """))
        proc = cli("train", str(tmp / f"{name}.yaml"), cwd=tmp)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp


def test_each_checkpoint_records_its_version_and_lineage(runs: Path) -> None:
    records = read_versions(runs / "a")
    assert sorted(records) == ["arith@v0", "arith@v1", "arith@v2"]
    assert [records[f"arith@v{i}"]["parent"] for i in range(3)] == [None, "arith@v0", "arith@v1"]
    last = records["arith@v2"]
    assert last["step"] == 2 and last["run"] == str((runs / "a").resolve())
    assert last["config_sha256"] == json.loads((runs / "a" / "run.json").read_text())[
        "config_sha256"]
    assert last["data"]["task"] == {"name": "arithmetic", "options": {}, "seed": 1,
                                    "train_size": 64}
    assert len(last["reward"]["my_rewards:exact"]) == 64  # sha256 of the function's source
    metrics = [json.loads(x) for x in (runs / "a" / "metrics.jsonl").read_text().splitlines()]
    assert last["metrics"]["eval/accuracy"] == metrics[-1]["eval/accuracy"]
    ls = cli("policies", "ls", str(runs / "a"), cwd=runs)
    assert ls.returncode == 0 and [x.split()[0] for x in ls.stdout.splitlines()[1:]] == [
        "arith@v0", "arith@v1", "arith@v2"]
    show = cli("policies", "show", str(runs / "a"), "arith", cwd=runs)  # the newest
    assert json.loads(show.stdout) == last


def test_diff_names_config_data_and_reward_source(runs: Path) -> None:
    same = cli("policies", "diff", str(runs / "a"), "arith@v1", "arith@v2", cwd=runs)
    assert same.returncode == 0 and "same code, config, data and reward" in same.stdout
    proc = cli("policies", "diff", str(runs / "a"), "arith", f"{runs / 'b'}:arith", cwd=runs)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "config_sha256: " in out and "policy.optim.lr: 0.0001 there, 0.0003 here" in out
    assert "task.seed: 1 there, 2 here" in out
    assert 'reward: "my_rewards:exact" there, "my_rewards:starts" here' in out
    assert "\ndata:\n  data.task: " in out and '"seed": 1' in out and '"seed": 2' in out
    assert "\nreward:\n  reward.my_rewards:exact: " in out and " vs null\n" in out
    assert "  reward.my_rewards:starts: null vs " in out
    assert "code:" not in out  # one checkout ran both


def test_a_code_change_is_named() -> None:
    base = {"code": "abc", "config_sha256": "c", "data": {}, "reward": {"r": "1" * 64},
            "metrics": {"eval/accuracy": 0.5}}
    other = {**base, "code": "def+dirty", "reward": {"r": "2" * 64},
             "metrics": {"eval/accuracy": 0.75}}
    lines = diff((Path("x"), base), (Path("y"), other))
    assert lines == ["code: abc vs def+dirty", "reward:", f"  reward.r: {'1' * 12} vs {'2' * 12}",
                     "metrics: eval/accuracy 0.5 -> 0.75"]


def test_unknown_versions_are_one_line(runs: Path) -> None:
    proc = cli("policies", "show", str(runs / "a"), "arith@v9", cwd=runs)
    assert proc.returncode == 2 and proc.stderr == (
        f"error: 'arith@v9' is not a version of {runs / 'a'}; versions: arith@v0, arith@v1, "
        "arith@v2\n")
    empty = cli("policies", "ls", str(runs), cwd=runs)
    assert empty.returncode == 2 and "has no versions.json" in empty.stderr


def test_a_decomposer_run_hashes_its_family_source() -> None:
    """The family's class source is the reward of a decomposer run (its verifiers pay); versions
    finds the decomposer's registry without importing it (a layer above)."""
    from agentrt.decomposer.families.wordchain import WordChain

    family = {"name": "wordchain", "options": {}, "seed": 3, "train_size": 8}
    got = provenance({"family": family}, Path("."))
    assert got["data"] == {"family": family}
    assert got["reward"] == {"wordchain": source_sha(WordChain)} and source_sha(WordChain)
    unknown = provenance({"family": {**family, "name": "nope"}}, Path("."))
    assert unknown["reward"] == {"nope": None}


def test_every_data_and_reward_source_has_a_version(tmp_path: Path) -> None:
    """Issue 41: a prompt data file is recorded with its sha256 (not its path alone), a learned
    reward model with the sha256 of its config and weights, a reward service by its redacted
    URL, and a Redis prompt stream by its url, stream, group and consumer; each changes when
    what it names changes."""
    rows = tmp_path / "prompts.jsonl"
    rows.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    rm = tmp_path / "rm"
    rm.mkdir()
    (rm / "config.json").write_text("{}")
    (rm / "model.safetensors").write_bytes(b"weights-1")
    task = {"name": "dataset", "options": {"path": str(rows)}, "seed": 1, "train_size": 8}
    sources = [{"model": str(rm)}, {"http": "http://127.0.0.1:9/score?api_key=***"},
               {"python": "exact_match"}]
    first = provenance({"task": task, "reward": sources}, tmp_path)
    assert first["data"]["file"] == {"path": str(rows), "sha256": sha256_of(rows)}
    assert len(first["reward"][str(rm)]) == 64 and first["reward"]["exact_match"]
    assert first["reward"]["http://127.0.0.1:9/score?api_key=***"] == (
        "service http://127.0.0.1:9/score?api_key=***")
    rows.write_text('{"prompt": "1+2=", "answer": "3"}\n')
    (rm / "model.safetensors").write_bytes(b"weights-2")
    second = provenance({"task": task, "reward": sources}, tmp_path)
    assert second["data"]["file"]["sha256"] != first["data"]["file"]["sha256"]
    assert second["reward"][str(rm)] != first["reward"][str(rm)]
    stream = {"name": "redis", "options": {"redis": {"url": "redis://:***@h:6379/0"},
                                           "stream": "p", "group": "g", "consumer": "c"}}
    got = provenance({"task": stream, "reward": "exact_match"}, tmp_path)
    assert got["data"]["stream"] == {"url": "redis://:***@h:6379/0", "stream": "p",
                                     "group": "g", "consumer": "c"}
