"""Asymmetric roles in a league run: Bargain-v0 with one LM policy pinned to each side
(examples/bargain_roles.yaml), trained together; each is evaluated only against the scripted
haggler pinned to the other side."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrt.config.load import load_config
from agentrt.controller.checkpoint import load_checkpoint
from agentrt.controller.run_dir import RunDir
from agentrt.tournaments.records import MatchStore
from agentrt.tournaments.run_config import TournamentRunConfig
from agentrt.tournaments.trainer import LeagueTrainer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bargain_roles.yaml"
BUYER_SIDE = {"buyer", "haggler_buyer"}  # player_0, the opener
SELLER_SIDE = {"seller", "haggler_seller"}  # player_1


def config(run_dir: Path, *over: str) -> TournamentRunConfig:
    return load_config(EXAMPLE, [f"run_dir={run_dir}", "progress=false", "threads=1", *over],
                       TournamentRunConfig)


def evals(run_dir: Path) -> dict[int, dict[str, float]]:
    return {m["step"]: m for m in RunDir(run_dir).read_metrics()
            if any(k.startswith("eval/") for k in m)}


def test_pinned_sides_play_only_their_seats_and_are_evaluated_opposite_their_haggler(
        tmp_path, tiny_model_dir):
    model = [f"policies.{i}.model.{k}" for i in (0, 1) for k in ("preset=null",
                                                                 f"path={tiny_model_dir}")]
    LeagueTrainer(config(tmp_path, *model, "warm_start.steps=1", "warm_start.games_per_step=4",
                         "train.steps=3", "train.games_per_step=8", "eval.every=3",
                         "eval.games=4", "schedule.snapshot.every=2",
                         "schedule.snapshot.min_steps=1")).run()
    with MatchStore(tmp_path) as store:
        played = [r.match.keys for r, _ in store.results()]
    assert len(played) == 3 * 8
    assert all(b.split("@")[0] in BUYER_SIDE and s.split("@")[0] in SELLER_SIDE
               for b, s in played), played
    assert {"buyer", "seller"} <= {k for keys in played for k in keys}
    assert any(k.startswith("seller@") for _, k in played)  # snapshots keep their side
    pools = load_checkpoint(RunDir(tmp_path).checkpoints()[-1])["pools"]
    assert pools["buyer"]["policies"]["buyer"]["version"] == 3
    assert pools["seller"]["policies"]["seller"]["version"] == 3
    final = evals(tmp_path)[3]
    # Each learner plays its own seat against the haggler of the other side, and no other pair.
    assert {"eval/return_vs_haggler_seller@buyer", "eval/win_rate_seat0_vs_haggler_seller@buyer",
            "eval/return_vs_haggler_buyer@seller",
            "eval/win_rate_seat1_vs_haggler_buyer@seller"} <= set(final)
    assert not [k for k in final if k.endswith("_vs_haggler_buyer@buyer")
                or k.endswith("_vs_haggler_seller@seller") or "seat1_vs_haggler_seller" in k
                or "seat0_vs_haggler_buyer" in k]


@pytest.mark.slow
def test_buyer_and_seller_trained_together_both_raise_their_deal_value(tmp_path):
    """Must-show: both sides, each with its own policy and objective, improve the figure they
    optimise: the greedy policy's mean deal value against the scripted haggler opposite it.
    A short version of the example (50 warm-start steps instead of 100, 20 steps instead of 40);
    measured in docs/tournaments.md ("Asymmetric roles")."""
    threads = torch.get_num_threads()
    try:
        LeagueTrainer(config(tmp_path, "warm_start.steps=50", "train.steps=20",
                             "eval.every=20")).run()
    finally:
        torch.set_num_threads(threads)
    curve = evals(tmp_path)
    for key in ("eval/return_vs_haggler_seller@buyer", "eval/return_vs_haggler_buyer@seller"):
        start, end = curve[0][key], curve[20][key]
        assert end >= max(0.4, start + 0.2), (key, start, end)
    assert curve[20]["eval/invalid_rate_vs_haggler_seller@buyer"] <= 0.05
    assert curve[20]["eval/invalid_rate_vs_haggler_buyer@seller"] <= 0.05
