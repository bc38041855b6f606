"""PSRO-Nash: the meta-solver, the meta-game a run measures, the mixture it trains against, and
the mixture's exact NashConv in a run's evaluation; fictitious play's average policy."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from agentrt.core.errors import ConfigError
from agentrt.config.load import validate_config
from agentrt.controller.run_dir import RunDir
from agentrt.tournaments.config import build_scheduler
from agentrt.tournaments.psro import PSRO, solve_symmetric_zero_sum
from agentrt.tournaments.run_config import TournamentRunConfig
from agentrt.tournaments.trainer import LeagueTrainer
from agentrt.tournaments.types import Entrant, MatchResult, TournamentError


def test_the_meta_solver_finds_the_nash_of_small_games() -> None:
    rps = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]], dtype=float)
    assert np.allclose(solve_symmetric_zero_sum(rps), [1 / 3] * 3, atol=1e-6)
    # rock wins 2 against scissors: the Nash plays paper twice as often, (1/4, 1/2, 1/4)
    biased = np.array([[0, -1, 2], [1, 0, -1], [-2, 1, 0]], dtype=float)
    x = solve_symmetric_zero_sum(biased)
    assert np.allclose(x, [0.25, 0.5, 0.25], atol=1e-6)
    assert min((x @ biased)) >= -1e-9  # the value of a symmetric zero-sum game is 0
    dominated = np.array([[0, 1], [-1, 0]], dtype=float)
    assert np.allclose(solve_symmetric_zero_sum(dominated), [1, 0])


def _rps_type(version: int) -> int:
    """The learner's strategy at each weight version: rock (0) until version 0, then paper
    from version 1, scissors from 4, rock again from 7: each beats the one before."""
    return ((version + 2) // 3) % 3


def _rps_result(match) -> MatchResult:
    a, b = (_rps_type(p.version) for p in match.players)
    scores = (0.5, 0.5) if a == b else (1.0, 0.0) if (a - b) % 3 == 1 else (0.0, 1.0)
    return MatchResult(match, scores, 1)


def test_psro_measures_a_cyclic_meta_game_and_mixes_uniformly() -> None:
    sched = build_scheduler({"format": "psro", "psro_explore": 0.3, "win_rate_decay": 0.5,
                             "snapshot": {"every": 3, "win_rate": None, "min_steps": 1}},
                            [Entrant("lm", True)], ["rps"], seed=0)
    assert isinstance(sched, PSRO)
    sched.on_step(0, {"lm": 0})
    assert sched.meta_strategy("lm") == {"lm@0": 1.0}
    faced: Counter[str] = Counter()
    for step in range(1, 7):
        matches = sched.next_matches(40)
        faced.update(f"{step}:" + m.players[1 - [p.learning for p in m.players].index(True)].key
                     for m in matches)
        sched.report([_rps_result(m) for m in matches])
        sched.on_step(step, {"lm": step})
        if step == 3:  # paper entered: it beats rock, so the mixture is pure paper
            assert sched.meta[("lm@3", "lm@0")] == pytest.approx(1.0)
            assert sched.meta_strategy("lm") == pytest.approx({"lm@0": 0.0, "lm@3": 1.0})
    keys, m = sched.payoff()
    assert keys == ["lm@0", "lm@3", "lm@6"]
    assert np.allclose(m, [[0.5, 0.0, 1.0], [1.0, 0.5, 0.0], [0.0, 1.0, 0.5]], atol=0.01)
    assert sched.meta_strategy("lm") == pytest.approx(
        {"lm@0": 1 / 3, "lm@3": 1 / 3, "lm@6": 1 / 3}, abs=0.02)
    # steps 4-6 trained against the pure-paper mixture, plus the uniform exploration share
    late: Counter[str] = Counter()
    for k, n in faced.items():
        if int(k.split(":")[0]) > 3:
            late[k.split(":")[1]] += n
    assert late["lm@3"] > 90 and late["lm@0"] > 0


def test_psro_options_are_validated_and_fsp_reports_its_average_policy() -> None:
    with pytest.raises(ConfigError, match="psro_explore"):
        build_scheduler({"format": "psro", "psro_explore": 1.5}, [Entrant("lm", True)], ["x"])
    fsp = build_scheduler({"format": "fsp", "snapshot": {"every": 1, "min_steps": 1}},
                          [Entrant("lm", True), Entrant("random")], ["x"])
    for step in (1, 2, 3):
        fsp.on_step(step, {"lm": step})
    assert fsp.meta_strategy("lm") == {f"lm@{v}": 0.25 for v in range(4)}  # not the baseline
    # the exploiter's format: only the fixed entrants, never a snapshot, and it needs one
    exploit = build_scheduler({"format": "exploit"}, [Entrant("x", True), Entrant("target")],
                              ["x"])
    for step in (1, 2):
        assert exploit.on_step(step, {"x": step}) == []
    assert {p.key for m in exploit.next_matches(20) for p in m.players} == {"x", "target"}
    with pytest.raises(TournamentError, match="fixed entrants"):
        build_scheduler({"format": "exploit"}, [Entrant("x", True)], ["x"])


def test_a_psro_run_reports_the_mixtures_exact_nash_conv(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = {
        "seed": 3, "run_dir": str(tmp_path), "progress": False,
        "envs": [{"id": "KuhnPoker-v0"}],
        "policies": [{"id": "lm", "model": {"path": str(tiny_model_dir)},
                      "rollout": {"sampling": {"max_new_tokens": 4, "temperature": 1.0}}}],
        "schedule": {"format": "psro", "snapshot": {"every": 1, "min_steps": 1}},
        "train": {"steps": 2, "games_per_step": 4},
        "eval": {"every": 2, "games": 2, "opponents": [], "exploitability": "auto"},
    }
    LeagueTrainer(validate_config(cfg, TournamentRunConfig)).run()
    rows = [m for m in RunDir(tmp_path).read_metrics()
            if "eval/nash_conv_mixture/KuhnPoker-v0" in m]
    assert [m["step"] for m in rows] == [0, 2]
    # at step 0 the mixture is the warm start alone: its NashConv is the policy's own
    assert rows[0]["eval/nash_conv_mixture/KuhnPoker-v0"] == pytest.approx(
        rows[0]["eval/nash_conv/KuhnPoker-v0"], abs=1e-6)
    assert 0.0 <= rows[1]["eval/nash_conv_mixture/KuhnPoker-v0"] <= 6.0
