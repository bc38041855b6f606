"""Role-conditioned advantage estimation ("rae"): per-(env, role, policy) EMA baselines that
remove the first-mover bias a shared baseline leaves in zero-sum self-play."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from agentrt.algos import ADVANTAGES, RAE_BASELINES, AdvantageInputs, RAEState, rae_group_id
from agentrt.algos import use_rae_state
from agentrt.config import AlgorithmConfig


def _inputs(scores: list[float], groups: list[str], width: int = 6) -> AdvantageInputs:
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width)
    mask[:, 2:5] = 1.0
    rewards[:, 4] = torch.tensor(scores)  # outcome on the last generated token
    return AdvantageInputs(token_rewards=rewards, loss_mask=mask, group_ids=groups)


def test_first_batch_uses_zero_baseline_then_the_ema() -> None:
    cfg = AlgorithmConfig(advantage="rae")
    g0, g1 = rae_group_id("ttt", "player_0", "lm"), rae_group_id("ttt", "player_1", "lm")
    with use_rae_state(RAEState(alpha=0.5)) as state:
        adv, ret = ADVANTAGES.get("rae")(_inputs([1.0, 0.0, -1.0], [g0, g0, g1]), cfg)
        assert torch.allclose(adv[:, 3], torch.tensor([1.0, 0.0, -1.0]))  # b = 0 at first
        assert torch.equal(adv[:, :2], torch.zeros(3, 2)) and torch.equal(adv, ret)
        assert state.baseline(g0) == pytest.approx(0.25)  # 0.5 * 0 + 0.5 * mean(1, 0)
        assert state.baseline(g1) == pytest.approx(-0.5)
        adv, _ = ADVANTAGES.get("rae")(_inputs([1.0, -1.0], [g0, g1]), cfg)
        assert torch.allclose(adv[:, 2], torch.tensor([0.75, -0.5]))
    assert RAE_BASELINES.baseline(g0) == 0.0  # the scoped state did not touch the global one


def test_role_baselines_remove_the_first_mover_bias() -> None:
    """Seat 0 wins 70% of games (+1/-1): a shared baseline leaves each role a mean advantage of
    about +-0.4 per step; per-role baselines bring each role's mean advantage to ~0."""
    rng = np.random.default_rng(0)
    cfg = AlgorithmConfig(advantage="rae")
    g0, g1 = rae_group_id("ttt", "player_0", "lm"), rae_group_id("ttt", "player_1", "lm")
    shared = "ttt|any|lm"
    per_role, pooled = {g0: [], g1: []}, {g0: [], g1: []}
    with use_rae_state(RAEState()):
        for step in range(300):
            win0 = rng.random(32) < 0.7
            s = np.concatenate([np.where(win0, 1.0, -1.0), np.where(win0, -1.0, 1.0)])
            roles = [g0] * 32 + [g1] * 32
            adv_role, _ = ADVANTAGES.get("rae")(_inputs(list(s), roles), cfg)
            adv_pool, _ = ADVANTAGES.get("rae")(_inputs(list(s), [shared] * 64), cfg)
            if step >= 100:  # after the EMA warmed up (0.95^100 < 0.01)
                for g, rows in ((g0, slice(0, 32)), (g1, slice(32, 64))):
                    per_role[g].append(float(adv_role[rows, 3].mean()))
                    pooled[g].append(float(adv_pool[rows, 3].mean()))
    assert abs(np.mean(per_role[g0])) < 0.05 and abs(np.mean(per_role[g1])) < 0.05
    assert np.mean(pooled[g0]) > 0.3 and np.mean(pooled[g1]) < -0.3


def test_groups_of_other_policies_and_envs_never_mix() -> None:
    cfg = AlgorithmConfig(advantage="rae")
    ids = [rae_group_id("ttt", "player_0", "lm"), rae_group_id("ttt", "player_0", "other"),
           rae_group_id("kuhn", "player_0", "lm")]
    with use_rae_state(RAEState(alpha=0.0)) as state:  # alpha 0: baseline = last batch mean
        ADVANTAGES.get("rae")(_inputs([1.0, -1.0, 0.5], ids), cfg)
        assert [state.baseline(g) for g in ids] == [1.0, -1.0, 0.5]


def test_bad_group_ids_are_rejected() -> None:
    cfg = AlgorithmConfig(advantage="rae")
    with use_rae_state(RAEState()), pytest.raises(ValueError, match="env\\|role\\|policy"):
        ADVANTAGES.get("rae")(_inputs([1.0], ["prompt-17"]), cfg)
    with pytest.raises(ValueError, match="role"):
        rae_group_id("ttt", "", "lm")


def test_state_round_trips_per_policy_for_checkpoints() -> None:
    state = RAEState(alpha=0.9)
    ids = [rae_group_id("ttt", "player_0", "lm"), rae_group_id("ttt", "player_1", "lm"),
           rae_group_id("ttt", "player_0", "other")]
    state.step(ids, torch.tensor([1.0, -1.0, 0.5]))
    saved = json.loads(json.dumps(state.state_dict(policy_id="lm")))
    assert set(saved["baselines"]) == set(ids[:2])
    restored = RAEState()
    restored.load_state_dict(saved)
    assert restored.alpha == 0.9
    assert [restored.baseline(g) for g in ids] == [pytest.approx(0.1), pytest.approx(-0.1), 0.0]
    with pytest.raises(ValueError, match="alpha"):
        RAEState(alpha=1.0)


def test_rae_on_collated_multi_turn_trajectories() -> None:
    """End to end through the real data types: two seats of one tic-tac-toe game, multi-turn."""
    from agentrt.types import Trajectory, Turn, collate

    def traj(role: str, outcome: float) -> Trajectory:
        t1 = Turn([1, 2], [3, 4], [-0.1, -0.2], role=role, policy_id="lm")
        t2 = Turn([1, 2, 3, 4, 5], [6], [-0.3], reward=outcome, role=role, policy_id="lm")
        return Trajectory([t1, t2], group_id=rae_group_id("ttt", role, "lm"), env="ttt",
                          role=role, policy_id="lm", outcome=outcome)

    batch = collate([traj("player_0", 1.0), traj("player_1", -1.0)])
    inputs = AdvantageInputs(batch.token_rewards, batch.loss_mask, batch.group_ids)
    with use_rae_state(RAEState(alpha=0.5)) as state:
        ADVANTAGES.get("rae")(inputs, AlgorithmConfig(advantage="rae"))
        adv, _ = ADVANTAGES.get("rae")(inputs, AlgorithmConfig(advantage="rae"))
    # baselines after one batch: +0.5 and -0.5; advantages only on the 3 generated tokens
    assert state.baseline("ttt|player_0|lm") == pytest.approx(0.75)
    assert torch.allclose(adv[0], torch.tensor([0, 0, 0.5, 0.5, 0, 0.5]))
    assert torch.allclose(adv[1], torch.tensor([0, 0, -0.5, -0.5, 0, -0.5]))
