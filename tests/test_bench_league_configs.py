"""The league benches' arms are valid configs, so the benches cannot rot between their (long)
runs: every (game, format) of bench/exploitability.py and every variant of bench/turn_credit.py
passes the run config's validation (which also plays each baseline one game)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from agentrt.config.load import validate_config
from agentrt.core.plugins import config_imports, load_plugins
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


def test_every_new_games_arm_validates_with_a_set_change(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench("new_games")
    monkeypatch.syspath_prepend(str(bench.PLUGIN))   # Nim-v0 comes from the plugin example
    sets = ["policies.0.algorithm.rae_per_state=false", "policies.0.optim.lr=3.0e-4"]
    for game, (kwargs, heuristic) in bench.GAMES.items():
        raw = bench.run_config(game, 1, 10, tmp_path / game, sets)
        load_plugins(config_imports(raw))
        cfg = validate_config({k: v for k, v in raw.items() if k != "imports"},
                              TournamentRunConfig)
        assert cfg.envs[0].id == game and cfg.envs[0].kwargs == kwargs
        assert cfg.policies[0].algorithm.rae_per_state is False
        assert cfg.policies[0].optim.lr == pytest.approx(3e-4)
        assert {b.id: b.kind for b in cfg.baselines}["heuristic"] == heuristic
        assert cfg.train.steps == 10 and cfg.eval.every == 10


def test_new_games_reference_rows_are_the_perfect_players_figures() -> None:
    """Hexapawn's Black wins every game with perfect play; White wins some against random."""
    bench = _bench("new_games")
    row = bench.perfect_row("Hexapawn-v0", 20)
    assert row["win_vs_random/seat1"] == 1.0 and row["score_vs_heuristic/seat1"] == 1.0
    assert 0.0 < row["win_vs_random/seat0"] < 1.0


def test_new_games_curve_reads_every_evaluation_seat_averaged(tmp_path: Path) -> None:
    bench = _bench("new_games")
    def evaluation(step: int, win: float, blunders: int) -> dict:
        row = {"step": step}
        for s in (0, 1):
            row |= {f"eval/win_rate_seat{s}_vs_random": win + s * 0.1,
                    f"eval/win_rate_seat{s}_vs_heuristic": 0.25,
                    f"eval/draw_rate_seat{s}_vs_heuristic": 0.5,
                    f"eval/blunders/Hexapawn-v0/seat{s}": blunders}
        return row
    rows = [evaluation(50, 0.5, 3), {"step": 51, "train/loss": 1.0}, evaluation(100, 0.7, 1)]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    curve = bench.eval_curve(metrics, "Hexapawn-v0")
    assert [c["step"] for c in curve] == [50, 100]
    assert curve[1]["win_vs_random"] == pytest.approx(0.75)
    assert curve[0]["score_vs_heuristic"] == pytest.approx(0.5) and curve[0]["blunders"] == 6
