"""README's "Your own model" config is valid as printed: its YAML block, run by ``agentrt
check-config`` beside a Qwen2 folder saved as a user's checkpoint is (``./my-qwen``), passes, and
names that folder; without the folder the check fails naming ``policy.model.path``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from agentrt.cli import main
from agentrt.policies.models import build_model

ROOT = Path(__file__).resolve().parents[1]


def readme_config() -> str:
    """The first ```yaml block after README's "Your own model" heading."""
    text = (ROOT / "README.md").read_text()
    section = text.split("### Your own model", 1)[1]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def check_config(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                 path: Path) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["agentrt", "check-config", str(path)])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_readme_own_model_config_checks(tmp_path, monkeypatch, capsys):
    text = readme_config()
    assert yaml.safe_load(text)["policy"]["model"] == {"path": "./my-qwen"}
    (tmp_path / "my_grpo.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    code, _, err = check_config(monkeypatch, capsys, tmp_path / "my_grpo.yaml")
    assert code != 0 and "policy.model.path" in err and "my-qwen" in err
    build_model(tmp_path / "my-qwen", "qwen2-nano", seed=0)
    code, out, err = check_config(monkeypatch, capsys, tmp_path / "my_grpo.yaml")
    assert code == 0, err
    assert out.splitlines()[0] == "# train config, valid"
    assert "path: ./my-qwen" in out and "enabled: true" in out
