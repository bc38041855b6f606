"""The shipped league on Ray equals the league in-process: same match records, same weights."""

from __future__ import annotations

from pathlib import Path

import torch

from agentrt.config.load import load_config
from agentrt.controller.checkpoint import load_checkpoint
from agentrt.controller.run_dir import RunDir
from agentrt.tournaments.records import MatchStore
from agentrt.tournaments.run_config import TournamentRunConfig
from agentrt.tournaments.trainer import LeagueTrainer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ttt_league.yaml"
SHORT = ["train.steps=4", "train.games_per_step=16", "warm_start.steps=4",
         "warm_start.games_per_step=8", "eval.every=2", "eval.games=8", "checkpoint.every=2",
         "progress=false", "threads=1", "policies.0.model.preset=llama-nano"]


def run(run_dir: Path, backend: str) -> tuple[list, dict[str, torch.Tensor]]:
    cfg = load_config(EXAMPLE, SHORT + [f"run_dir={run_dir}", f"runtime.backend={backend}",
                                        "runtime.num_cpus=2"], model=TournamentRunConfig)
    LeagueTrainer(cfg).run()
    store = MatchStore(run_dir)
    try:
        records = sorted((r.match.match_id, r.match.keys, r.scores, step)
                         for r, step in store.results())
    finally:
        store.close()
    state = load_checkpoint(RunDir(run_dir).checkpoints()[-1])
    return records, state["pools"]["lm"]["policies"]["lm"]["model"]


def test_ray_and_local_leagues_play_the_same_matches_and_end_at_the_same_weights(
        ray_session, tmp_path):
    ray_records, ray_weights = run(tmp_path / "ray", "ray")
    local_records, local_weights = run(tmp_path / "local", "local")
    assert len(local_records) == 4 * 16
    assert ray_records == local_records  # ids, seats (keys in seat order), outcomes, steps
    worst = max(float((ray_weights[k] - local_weights[k]).abs().max()) for k in local_weights)
    assert worst < 1e-5, worst
    snaps = load_checkpoint(RunDir(tmp_path / "ray").checkpoints()[-1])["pools"]["lm"]
    assert "lm@0" in snaps["snapshots"]  # the frozen opponent lives in the learner's Ray pool
