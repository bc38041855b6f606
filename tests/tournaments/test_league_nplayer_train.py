"""League runs (``agentrt tournament run``'s LeagueTrainer) over envs that are not two-seat games:
three-player Kuhn poker (3 seats) and the memory example on Recall-v0 (1 seat). Before matches had
N seats, both failed at step 0: the scheduler only made two-player matches."""

from __future__ import annotations

from pathlib import Path

from agentrt.config.load import load_config
from agentrt.memory import open_bank
from agentrt.controller.checkpoint import load_checkpoint
from agentrt.controller.run_dir import RunDir
from agentrt.tournaments.records import MatchStore
from agentrt.tournaments.report import build_leaderboard
from agentrt.tournaments.run_config import TournamentRunConfig
from agentrt.tournaments.trainer import LeagueTrainer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def short(example: str, run_dir: Path, model_dir: Path, *over: str) -> TournamentRunConfig:
    return load_config(EXAMPLES / example, [
        f"run_dir={run_dir}", "progress=false", "threads=1", "policies.0.model.preset=null",
        f"policies.0.model.path={model_dir}", "checkpoint.every=100", *over],
        TournamentRunConfig)


def test_three_seat_league_schedules_plays_and_rates_three_seat_matches(tmp_path,
                                                                        tiny_model_dir):
    cfg = short("kuhn3_league.yaml", tmp_path, tiny_model_dir, "warm_start.steps=2",
                "warm_start.games_per_step=8", "train.steps=4", "train.games_per_step=12",
                "eval.every=4", "eval.games=12", "schedule.snapshot.every=2",
                "schedule.snapshot.min_steps=1")
    last = LeagueTrainer(cfg).run()
    with MatchStore(tmp_path) as store:
        played = [r for r, _ in store.results()]
    assert len(played) == 4 * 12
    assert all(len(r.match.players) == 3 and len(r.scores) == 3 for r in played)
    assert all("lm" in r.match.keys for r in played)  # every match is one of the learner's
    seats = {seat for r in played for seat, key in enumerate(r.match.keys) if key == "lm"}
    assert seats == {0, 1, 2}  # the learner took every seat
    rated = {row.key for row in build_leaderboard(played)}
    assert {"lm", "random", "lm@0", "lm@2"} <= rated  # every entrant and snapshot that played
    pool = load_checkpoint(RunDir(tmp_path).checkpoints()[-1])["pools"]["lm"]
    assert pool["policies"]["lm"]["version"] == 4  # one RL update per step
    assert "actor/loss" in last and "eval/win_rate_seat2_vs_random" in last
    assert "lm@2" in (tmp_path / "report.html").read_text()


def test_memory_league_on_one_seat_recall_runs_and_writes_its_bank(tmp_path, tiny_model_dir):
    """docs/memory.md's league (examples/recall_memory_league.yaml): the learner alone in every
    match, its memories in the prompt, facts and outcomes written to its private bank."""
    cfg = short("recall_memory_league.yaml", tmp_path, tiny_model_dir, "train.steps=2",
                "train.games_per_step=8")
    last = LeagueTrainer(cfg).run()
    with MatchStore(tmp_path) as store:
        played = [r for r, _ in store.results()]
    assert len(played) == 2 * 8 and all(r.match.keys == ("lm",) for r in played)
    assert "reward/solved_rate/lm" in last and "actor/loss" in last
    bank = open_bank({"name": "recall"}, run_dir=tmp_path)
    try:
        facts, outcomes = bank.count({"tags": ["fact"]}), bank.count({"tags": ["outcome"]})
    finally:
        bank.close()
    assert outcomes == 16 and 1 <= facts <= 16  # a fact already stored is not stored again
