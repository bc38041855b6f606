"""Evaluation-only opponents (``baselines[].eval_only``) and win/draw/loss per opponent and seat:
in a league's periodic evaluation and in ``agentrt tournament eval``'s table and files."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrt.cli import app
from agentrt.config.load import validate_config
from agentrt.core.errors import ConfigError
from agentrt.controller.run_dir import RunDir
from agentrt.tournaments.records import MatchStore
from agentrt.tournaments.run_config import TournamentRunConfig
from agentrt.tournaments.trainer import LeagueTrainer


def league(run_dir: Path, model_dir: Path, **over) -> dict:
    cfg = {
        "seed": 5, "run_dir": str(run_dir), "progress": False,
        "envs": [{"id": "TicTacToe-v0", "template": {"history": False}}],
        "policies": [{"id": "lm", "model": {"path": str(model_dir)},
                      "rollout": {"sampling": {"max_new_tokens": 3, "top_k": 10}}}],
        "baselines": [{"id": "random", "kind": "random", "seed": 1},
                      {"id": "perfect", "kind": "minimax", "eval_only": True}],
        "schedule": {"format": "pfsp", "snapshot": {"every": 1, "win_rate": None,
                                                    "min_steps": 1}},
        "train": {"steps": 2, "games_per_step": 8},
        "eval": {"every": 2, "games": 6},
    }
    return cfg | over


def test_eval_only_config_defaults_and_refusals(tmp_path: Path) -> None:
    cfg = validate_config(league(tmp_path, tmp_path), TournamentRunConfig)
    assert cfg.eval.opponents == ("random", "perfect")  # random, and every eval-only baseline
    assert [e.policy_id for e in cfg.entrants()] == ["lm", "random"]  # never scheduled
    bad = league(tmp_path, tmp_path, eval={"opponents": ["random"]})
    with pytest.raises(ConfigError, match=r"baselines.1.eval_only: 'perfect' is evaluation-only "
                                          r"but not in eval.opponents"):
        validate_config(bad, TournamentRunConfig)
    with pytest.raises(ConfigError, match=r"eval.opponents \['perfekt'\] are not baselines or "
                                          r"frozen policies \(trainable: false\); valid: "
                                          r"random, perfect"):
        validate_config(league(tmp_path, tmp_path, eval={"opponents": ["perfekt"]}),
                        TournamentRunConfig)


def test_an_eval_only_opponent_never_plays_a_training_match_but_is_evaluated(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    LeagueTrainer(validate_config(league(tmp_path, tiny_model_dir), TournamentRunConfig)).run()
    with MatchStore(tmp_path, readonly=True) as store:
        played = {k for r, _ in store.results() for k in r.match.keys}
    assert "random" in played and "lm" in played and "perfect" not in played
    evals = [m for m in RunDir(tmp_path).read_metrics() if "eval/win_rate_vs_perfect" in m]
    assert [m["step"] for m in evals] == [0, 2]
    for m in evals:
        for opp in ("random", "perfect"):
            for seat in ("_seat0", "_seat1", ""):  # 3 games per seat; rates add up to 1
                rates = [m[f"eval/{k}_rate{seat}_vs_{opp}"] for k in ("win", "draw", "loss")]
                assert sum(rates) == pytest.approx(1.0) and all(r in {0, 1 / 3, 2 / 3, 1}
                                                                for r in rates), (seat, rates)
        assert m["eval/win_rate_vs_perfect"] == 0.0  # minimax never loses


def _expected(store: MatchStore) -> dict[tuple[str, str, int], list[float]]:
    """games, wins, draws, invalid moves per (player, opponent, player's seat), read from the
    records one match at a time (two seats)."""
    out: dict[tuple[str, str, int], list[float]] = defaultdict(lambda: [0, 0, 0, 0])
    for r, _ in store.results():
        keys = r.match.keys
        for seat in (0, 1):
            row = out[(keys[seat], keys[1 - seat], seat)]
            row[0] += 1
            row[1] += r.scores[seat] > r.scores[1 - seat]
            row[2] += r.scores[seat] == r.scores[1 - seat]
            row[3] += r.invalid_moves[seat]
    return out


def test_tournament_eval_prints_and_writes_win_draw_loss_per_pair_and_seat(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    run_dir = tmp_path / "eval"
    config = tmp_path / "eval.json"  # JSON is YAML
    config.write_text(json.dumps(league(
        run_dir, tiny_model_dir, schedule={"format": "round_robin", "rounds": 1,
                                           "games_per_pairing": 6},
        train={"steps": 1, "games_per_step": 18}, runner={"invalid_action": "end"})))
    result = CliRunner().invoke(app, ["tournament", "eval", str(config)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    head = next(i for i, x in enumerate(lines) if x.split()[:3] == ["player", "opponent", "seat"])
    printed = {}
    for line in lines[head + 2:]:
        if line.startswith("report: "):
            break
        player, opp, seat, games, *rates = line.split()
        printed[(player, opp, seat)] = (int(games), *map(float, rates))
    with MatchStore(run_dir, readonly=True) as store:
        expected = _expected(store)
    # 3 pairs (the eval-only baseline plays here), each player in each seat 3 times
    assert len(expected) == 12 and all(v[0] == 3 for v in expected.values())
    for (player, opp, seat), (n, wins, draws, invalid) in expected.items():
        assert printed[(player, opp, str(seat))] == pytest.approx(
            (n, wins / n, draws / n, (n - wins - draws) / n, invalid / n), abs=5e-4)
    for player, opp in {(p, o) for p, o, _ in expected}:
        assert printed[(player, opp, "all")][0] == 6
    assert all(printed[("perfect", opp, seat)][3] == 0.0  # minimax never loses
               for opp in ("lm", "random") for seat in ("0", "1", "all"))
    written = json.loads((run_dir / "seat_results.json").read_text())
    assert len(written) == len(printed) == 18
    for row in written:
        seat = "all" if row["seat"] is None else str(row["seat"])
        assert printed[(row["player"], row["opponent"], seat)] == pytest.approx(
            (row["games"], row["win"], row["draw"], row["loss"], row["invalid_per_game"]),
            abs=5e-4)
    assert "Win / draw / loss by opponent and seat" in (run_dir / "report.html").read_text()
