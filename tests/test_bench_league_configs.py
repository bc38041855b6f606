"""The league benches' arms are valid configs, so the benches cannot rot between their (long)
runs: every (game, format) of bench/exploitability.py and every variant of bench/turn_credit.py
passes the run config's validation (which also plays each baseline one game)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from agentrt.config.load import validate_config
from agentrt.tournaments.run_config import TournamentRunConfig

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_every_formats_arm_validates(tmp_path: Path) -> None:
    bench = _bench("exploitability")
    for game in bench.GAMES:
        for fmt in bench.FORMATS:
            cfg = validate_config(bench.run_config(game, fmt, 1, 10, 8, tmp_path / "run"),
                                  TournamentRunConfig)
            assert cfg.schedule.format == fmt and cfg.train.steps == 10


@pytest.mark.parametrize("variant", ["rae", "rae_per_state", "ppo", "best_response", "kl"])
def test_every_turn_credit_variant_validates(tmp_path: Path, variant: str) -> None:
    bench = _bench("turn_credit")
    assert variant in bench.VARIANTS
    cfg = validate_config(bench.run_config(variant, 1, 10, tmp_path / "run"),
                          TournamentRunConfig)
    algo = cfg.policies[0].algorithm
    assert (algo.advantage == "gae") == (variant == "ppo")
    assert algo.rae_per_state == (variant == "rae_per_state")
    assert any(b.kind == "best_response" for b in cfg.baselines) == (variant == "best_response")
    assert (algo.kl.coef > 0) == (variant == "kl") and cfg.train.steps == 10
