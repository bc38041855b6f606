"""``agentrt ckpt check``: checkpoints of two real short leagues (full weights, and a rank-8 LoRA
adapter) checked against configs and each other; every incompatibility names its difference."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrt.tools.ckpt_check import check

ROOT = Path(__file__).resolve().parents[1]
AGENTRT = [sys.executable, "-m", "agentrt.cli"]
SHORT = ["train.steps=1", "warm_start.steps=1", "train.games_per_step=8", "eval.games=4",
         "eval.every=2", "eval.exploitability=off", "progress=false", "threads=1"]


def config(tmp: Path, name: str, **policy: object) -> Path:
    """examples/ttt_league.yaml with its policy changed."""
    cfg = yaml.safe_load((ROOT / "examples" / "ttt_league.yaml").read_text())
    cfg["policies"][0].update(policy)
    cfg["run_dir"] = str(tmp / name)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENTRT, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("ckpt")
    out = {"full": config(tmp, "full"),
           "lora": config(tmp, "lora", lora={"enabled": True, "r": 8})}
    for name, path in out.items():
        proc = cli("tournament", "run", str(path), *[a for s in SHORT for a in ("--set", s)])
        assert proc.returncode == 0, proc.stderr[-3000:]
    out["tmp"] = tmp
    return out


def lines(ckpt: Path, against: Path | None = None) -> tuple[bool, list[str]]:
    verdict = check(ckpt, against)
    return verdict.ok, verdict.lines


def test_compatible_with_its_own_config_and_checkpoints(runs) -> None:
    full = runs["tmp"] / "full"
    proc = cli("ckpt", "check", str(full), "--against", str(full / "config.yaml"))
    assert proc.returncode == 0 and proc.stdout.startswith(f"{full}: compatible with"), proc
    assert lines(full, full / "checkpoints" / "step_0") == (True, [])
    assert lines(runs["tmp"] / "lora", runs["lora"]) == (True, [])
    alone = cli("ckpt", "check", str(full / "checkpoints" / "step_1"))
    assert alone.returncode == 0 and "format 1, step 1, policies: lm" in alone.stdout


def test_another_architecture_is_named_weight_by_weight(runs) -> None:
    nano = config(runs["tmp"], "nano", model={"preset": "llama-nano"})
    proc = cli("ckpt", "check", str(runs["tmp"] / "full"), "--against", str(nano))
    assert proc.returncode == 1 and "NOT compatible" in proc.stdout.splitlines()[0]
    assert ("policies.lm: model.embed_tokens.weight is (259, 128) in the checkpoint, (259, 64) "
            "in the config") in proc.stdout
    assert "more weight differences" in proc.stdout  # long lists are cut, not dumped


def test_lora_rank_and_kind_and_targets(runs) -> None:
    full, lora = runs["tmp"] / "full", runs["tmp"] / "lora"
    assert lines(full, runs["lora"]) == (False, [
        "policies.lm: the config trains a LoRA adapter, the checkpoint holds full weights"])
    assert lines(lora, runs["full"]) == (False, [
        "policies.lm: the checkpoint holds a LoRA adapter, the config trains full weights "
        "(lora.enabled: false)"])
    rank4 = config(runs["tmp"], "rank4", lora={"enabled": True, "r": 4})
    assert lines(lora, rank4) == (False, ["policies.lm.lora.r: 4 in the config, 8 in the "
                                          "checkpoint"])
    qv = config(runs["tmp"], "qv", lora={"enabled": True, "r": 8,
                                         "target_modules": ["q_proj", "v_proj"]})
    ok, found = lines(lora, qv)
    assert not ok and found[0].startswith("policies.lm.lora.target_modules: ['q_proj', "
                                          "'v_proj'] in the config, ['down_proj', 'gate_proj'")
    assert lines(full, lora) == (False, [
        "policies.lm: this checkpoint holds full weights, the other a LoRA adapter"])

def test_other_policies_and_damage(runs) -> None:
    renamed = config(runs["tmp"], "renamed", id="player")
    assert lines(runs["tmp"] / "full", renamed) == (False, [
        "policy 'lm' is in the checkpoint but not in the config",
        "policy 'player' of the config is not in the checkpoint"])
    broken = runs["tmp"] / "broken"
    shutil.copytree(runs["tmp"] / "full" / "checkpoints" / "step_1", broken)
    state = broken / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    proc = cli("ckpt", "check", str(broken), "--against", str(runs["full"]))
    assert proc.returncode == 1 and "cannot be loaded:" in proc.stdout, proc.stdout
    bad = cli("ckpt", "check", str(runs["tmp"] / "nothing"))
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1


def test_a_forced_resume_with_another_architecture_is_one_line(runs) -> None:
    """--resume force takes another config's identity, but weights that do not fit are refused
    with the first differing weight, not a torch traceback."""
    run = runs["tmp"] / "forced"
    shutil.copytree(runs["tmp"] / "full", run)
    nano = config(runs["tmp"], "forced", model={"preset": "llama-nano"})
    proc = cli("tournament", "run", str(nano), "--resume", "force",
               *[a for s in SHORT for a in ("--set", s)], "--set", "train.steps=2")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [x for x in proc.stderr.splitlines() if not x.startswith("WARNING ")]
    assert len(errors) == 1 and errors[0].startswith("error: "), proc.stderr[-2000:]
    assert "does not fit policy 'lm' of this config (size mismatch for model.embed_tokens" \
           ".weight: [259, 128] in the checkpoint, [259, 64] in this config)" in proc.stderr
