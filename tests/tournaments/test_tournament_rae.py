"""Role-conditioned advantage estimation ("rae"): per-(env, role, policy) EMA baselines that
remove the first-mover bias a shared baseline leaves in zero-sum self-play."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from agentrt.algos import ADVANTAGES
from agentrt.algos.advantages import AdvantageInputs
from agentrt.algos.config import AlgorithmConfig
from agentrt.algos.rae import RAE_BASELINES, RAEState, use_rae_state
from agentrt.core.types import GroupKey


def _inputs(scores: list[float], groups: list[GroupKey], width: int = 6) -> AdvantageInputs:
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width)
    mask[:, 2:5] = 1.0
    rewards[:, 4] = torch.tensor(scores)  # outcome on the last generated token
    return AdvantageInputs(token_rewards=rewards, loss_mask=mask, group_ids=groups)


def _spiral_reference(batches: list[tuple[list[GroupKey], list[float]]], alpha: float, init: str
                      ) -> tuple[list[list[float]], dict[GroupKey, float]]:
    """RAE as SPIRAL's ``prepare_trajectories`` does it, one game at a time: take the baseline
    before updating (a game is never in its own baseline), fold the game's return into the EMA,
    subtract. ``init="batch"``: a group without a baseline starts at its first batch's mean."""
    ema: dict[GroupKey, float] = {}
    advantages = []
    for groups, returns in batches:
        if init == "batch":
            for g in dict.fromkeys(groups):
                if g not in ema:
                    mine = [r for gg, r in zip(groups, returns) if gg == g]
                    ema[g] = sum(mine) / len(mine)
        out = []
        for g, r in zip(groups, returns):
            baseline = ema.get(g, 0.0)  # SPIRAL's EMA starts at 0.0
            ema[g] = alpha * baseline + (1 - alpha) * r
            out.append(r - baseline)
        advantages.append(out)
    return advantages, ema


@pytest.mark.parametrize("init", ["batch", "zero"])
def test_estimator_folds_each_trajectory_like_spirals_per_game_loop(init: str) -> None:
    rng = np.random.default_rng(0)
    cfg = AlgorithmConfig(advantage="rae")
    roles = [GroupKey("ttt", r, "lm") for r in ("player_0", "player_1")]
    late = GroupKey("kuhn", "player_0", "lm")  # appears from the third batch on
    batches = []
    for step in range(6):
        pool = roles + [late] * (step >= 2)
        groups = [pool[i] for i in rng.choice(len(pool), size=24)]
        batches.append((groups, [float(x) for x in rng.choice([-1.0, 0.0, 1.0], size=24)]))
    want_adv, want_base = _spiral_reference(batches, alpha=0.8, init=init)
    with use_rae_state(RAEState(alpha=0.8, init=init)) as state:
        for (groups, returns), want in zip(batches, want_adv):
            adv, _ = ADVANTAGES.get("rae")(_inputs(returns, groups), cfg)
            torch.testing.assert_close(adv[:, 3], torch.tensor(want, dtype=torch.float32))
        assert {g: state.baseline(g) for g in want_base} == pytest.approx(want_base)


def test_baseline_follows_a_change_of_win_rate_within_one_step() -> None:
    """64 games of one group per step: the baseline is 96% of the way to a new mean after one
    step (1 - 0.95^64), where folding one batch mean per step took ~60 steps."""
    g = GroupKey("ttt", "player_0", "lm")
    state = RAEState(alpha=0.95)
    state.step([g] * 64, -torch.ones(64))  # a learner that loses every game ...
    state.step([g] * 64, torch.ones(64))  # ... then wins every game
    assert state.baseline(g) == pytest.approx(1 - 2 * 0.95**64)  # 0.925; per batch: -0.9


def test_zero_init_measures_each_trajectory_before_folding_it() -> None:
    cfg = AlgorithmConfig(advantage="rae")
    g0, g1 = GroupKey("ttt", "player_0", "lm"), GroupKey("ttt", "player_1", "lm")
    with use_rae_state(RAEState(alpha=0.5, init="zero")) as state:
        adv, ret = ADVANTAGES.get("rae")(_inputs([1.0, 0.0, -1.0], [g0, g0, g1]), cfg)
        # g0: b = 0, A = 1, b <- 0.5; then A = 0 - 0.5, b <- 0.25. g1: b = 0, A = -1, b <- -0.5
        assert torch.allclose(adv[:, 3], torch.tensor([1.0, -0.5, -1.0]))
        assert torch.equal(adv[:, :2], torch.zeros(3, 2)) and torch.equal(adv, ret)
        assert state.baseline(g0) == pytest.approx(0.25)
        assert state.baseline(g1) == pytest.approx(-0.5)
        adv, _ = ADVANTAGES.get("rae")(_inputs([1.0, -1.0], [g0, g1]), cfg)
        assert torch.allclose(adv[:, 2], torch.tensor([0.75, -0.5]))
    assert RAE_BASELINES.baseline(g0) == 0.0  # the scoped state did not touch the global one


def test_batch_init_starts_each_new_group_at_its_first_batch_mean() -> None:
    cfg = AlgorithmConfig(advantage="rae")
    g0, g1 = GroupKey("ttt", "player_0", "lm"), GroupKey("ttt", "player_1", "lm")
    with use_rae_state(RAEState(alpha=0.5)) as state:  # init="batch", the default
        adv, _ = ADVANTAGES.get("rae")(_inputs([-1.0, -1.0, 0.0], [g0, g0, g0]), cfg)
        # A learner that loses most first games is not pushed away from every move it made:
        # b starts at the mean -2/3, then each game is measured and folded in turn
        # (b: -2/3 -> -5/6 -> -11/12 -> -11/24).
        assert torch.allclose(adv[:, 3], torch.tensor([-1 / 3, -1 / 6, 11 / 12]))
        assert state.baseline(g0) == pytest.approx(-11 / 24)
        adv, _ = ADVANTAGES.get("rae")(_inputs([1.0, 1.0], [g0, g1]), cfg)
        assert torch.allclose(adv[:, 3], torch.tensor([1 + 11 / 24, 0.0]))  # g1 is new: its mean
        assert state.baseline(g0) == pytest.approx(0.5 * -11 / 24 + 0.5 * 1.0)
        assert state.state_dict()["init"] == "batch"
    with pytest.raises(ValueError, match="init must be"):
        RAEState(init="mean")
    assert AlgorithmConfig(advantage="rae").rae_init == "batch"


def test_role_baselines_remove_the_first_mover_bias() -> None:
    """Seat 0 wins 70% of games (+1/-1): a shared baseline leaves each role a mean advantage of
    about +-0.4 per step; per-role baselines bring each role's mean advantage to ~0."""
    rng = np.random.default_rng(0)
    cfg = AlgorithmConfig(advantage="rae")
    g0, g1 = GroupKey("ttt", "player_0", "lm"), GroupKey("ttt", "player_1", "lm")
    shared = GroupKey("ttt", "any", "lm")
    per_role, pooled = {g0: [], g1: []}, {g0: [], g1: []}
    with use_rae_state(RAEState()):
        for step in range(300):
            win0 = rng.random(32) < 0.7  # each game gives one row per seat, seat 0 first
            s = np.stack([np.where(win0, 1.0, -1.0), np.where(win0, -1.0, 1.0)], 1).reshape(-1)
            roles = [g0, g1] * 32
            adv_role, _ = ADVANTAGES.get("rae")(_inputs(list(s), roles), cfg)
            adv_pool, _ = ADVANTAGES.get("rae")(_inputs(list(s), [shared] * 64), cfg)
            if step >= 100:  # long after the EMA warmed up
                for g, rows in ((g0, slice(0, 64, 2)), (g1, slice(1, 64, 2))):
                    per_role[g].append(float(adv_role[rows, 3].mean()))
                    pooled[g].append(float(adv_pool[rows, 3].mean()))
    assert abs(np.mean(per_role[g0])) < 0.05 and abs(np.mean(per_role[g1])) < 0.05
    assert np.mean(pooled[g0]) > 0.3 and np.mean(pooled[g1]) < -0.3


def test_groups_of_other_policies_and_envs_never_mix() -> None:
    cfg = AlgorithmConfig(advantage="rae")
    ids = [GroupKey("ttt", "player_0", "lm"), GroupKey("ttt", "player_0", "other"),
           GroupKey("kuhn", "player_0", "lm")]
    with use_rae_state(RAEState(alpha=0.0)) as state:  # alpha 0: baseline = last return
        ADVANTAGES.get("rae")(_inputs([1.0, -1.0, 0.5], ids), cfg)
        assert [state.baseline(g) for g in ids] == [1.0, -1.0, 0.5]


def test_bad_group_ids_are_rejected() -> None:
    cfg = AlgorithmConfig(advantage="rae")
    with use_rae_state(RAEState()):
        for bad in ("prompt-17", GroupKey("ttt", "", "lm")):
            with pytest.raises(ValueError, match="rae needs GroupKey group ids naming env, role"):
                ADVANTAGES.get("rae")(_inputs([1.0], [bad]), cfg)


def test_state_round_trips_per_policy_for_checkpoints() -> None:
    state = RAEState(alpha=0.9, init="zero")
    ids = [GroupKey("ttt", "player_0", "lm"), GroupKey("ttt", "player_1", "lm", opponents=("b",)),
           GroupKey("ttt", "player_0", "other")]
    state.step(ids, torch.tensor([1.0, -1.0, 0.5]))
    saved = json.loads(json.dumps(state.state_dict(policy_id="lm")))
    assert list(saved["baselines"]) == ["ttt|player_0|lm", "ttt|player_1|lm|vs=b"]  # plain
    restored = RAEState()
    restored.load_state_dict(saved)
    assert restored.alpha == 0.9 and restored.init == "zero"
    assert [restored.baseline(g) for g in ids] == [pytest.approx(0.1), pytest.approx(-0.1), 0.0]
    with pytest.raises(ValueError, match="alpha"):
        RAEState(alpha=1.0)


def test_checkpoints_saved_with_per_batch_folding_still_load() -> None:
    g = GroupKey("ttt", "player_0", "lm")
    # saved before ``init`` existed, n counting batches
    old = {"alpha": 0.5, "baselines": {"ttt|player_0|lm": [0.25, 7]}}
    state = RAEState()
    state.load_state_dict(json.loads(json.dumps(old)))
    base = state.step([g, g], torch.tensor([1.0, -1.0]))
    assert base.tolist() == [0.25, pytest.approx(0.625)]  # continues from the saved baseline
    assert state.state_dict()["baselines"]["ttt|player_0|lm"] == [pytest.approx(-0.1875), 9]


def test_checkpoints_with_string_group_ids_continue_the_runners_keys() -> None:
    """A league checkpoint written when group ids were strings: each baseline continues under
    the key the runner and ``rae_regroup`` build now, and saves back to the same string."""
    from agentrt.controller.objectives import rae_regroup
    from agentrt.core.types import Trajectory, Turn

    env = 'TicTacToe-v0{"compact": true}'
    old = {"alpha": 0.5, "init": "batch",
           "baselines": {f"{env}|player_1|lm|vs=lm": [0.5, 3], f"{env}|player_0|lm|vs=": [0.0, 1]}}
    state = RAEState()
    state.load_state_dict(json.loads(json.dumps(old)))
    played = Trajectory([Turn([1], [2], [0.0])], info={"opponents": ["lm@25"]},
                        group_id=GroupKey(env, "player_1", "lm", opponents=("lm@25",)))
    g = rae_regroup(played).group_id
    assert state.step([g], torch.tensor([1.0])).tolist() == [0.5]
    assert state.state_dict()["baselines"] == {f"{env}|player_1|lm|vs=lm": [0.75, 4],
                                               f"{env}|player_0|lm|vs=": [0.0, 1]}


def test_rae_on_collated_multi_turn_trajectories() -> None:
    """End to end through the real data types: two seats of one tic-tac-toe game, multi-turn."""
    from agentrt.core.types import Trajectory, Turn, collate

    def traj(role: str, outcome: float) -> Trajectory:
        t1 = Turn([1, 2], [3, 4], [-0.1, -0.2], role=role, policy_id="lm")
        t2 = Turn([1, 2, 3, 4, 5], [6], [-0.3], reward=outcome, role=role, policy_id="lm")
        return Trajectory([t1, t2], group_id=GroupKey("ttt", role, "lm"), env="ttt",
                          role=role, policy_id="lm", outcome=outcome)

    batch = collate([traj("player_0", 1.0), traj("player_1", -1.0)])
    inputs = AdvantageInputs(batch.token_rewards, batch.loss_mask, batch.group_ids)
    with use_rae_state(RAEState(alpha=0.5, init="zero")) as state:
        ADVANTAGES.get("rae")(inputs, AlgorithmConfig(advantage="rae"))
        adv, _ = ADVANTAGES.get("rae")(inputs, AlgorithmConfig(advantage="rae"))
    # baselines after one batch: +0.5 and -0.5; advantages only on the 3 generated tokens
    assert state.baseline(GroupKey("ttt", "player_0", "lm")) == pytest.approx(0.75)
    assert torch.allclose(adv[0], torch.tensor([0, 0, 0.5, 0.5, 0, 0.5]))
    assert torch.allclose(adv[1], torch.tensor([0, 0, -0.5, -0.5, 0, -0.5]))


def test_league_configs_default_to_rae_for_zero_sum_games() -> None:
    from agentrt.config.load import validate_config
    from agentrt.tournaments.run_config import TournamentRunConfig

    def advantages(envs: list[str], *algos: dict) -> list[str]:
        cfg = validate_config({"envs": [{"id": e} for e in envs], "baselines": [{"id": "random"}],
                               "policies": [{"id": f"p{i}", "algorithm": a}
                                            for i, a in enumerate(algos)]}, TournamentRunConfig)
        return [p.algorithm.advantage for p in cfg.policies]

    named = ({}, {"mini_batches": 2}, {"name": "grpo"}, {"advantage": "rloo"})
    assert advantages(["TicTacToe-v0", "KuhnPoker-v0"], *named) == ["rae", "rae", "grpo", "rloo"]
    assert advantages(["Bargain-v0"], {}) == ["grpo"]  # general-sum: the preset's estimator
    assert advantages(["TicTacToe-v0", "Bargain-v0"], {}) == ["grpo"]


def test_league_rae_groups_drop_snapshot_versions() -> None:
    from agentrt.controller.objectives import rae_regroup
    from agentrt.core.types import Trajectory, Turn

    env = 'TicTacToe-v0{"compact": true}'

    def traj(opponent: str) -> Trajectory:
        return Trajectory([Turn([1], [2], [0.0])], info={"opponents": [opponent]},
                          group_id=GroupKey(env, "player_1", "lm", opponents=(opponent,)))

    groups = {rae_regroup(traj(o)).group_id for o in ("lm@0", "lm@25", "lm@50")}
    assert groups == {GroupKey(env, "player_1", "lm", opponents=("lm",))}
    assert str(groups.pop()) == f"{env}|player_1|lm|vs=lm"  # the id checkpoints hold
    assert rae_regroup(traj("random")).group_id.opponents == ("random",)
    replayed = Trajectory([Turn([1], [2], [0.0])],  # late feedback on a prompt: its own group
                          group_id=GroupKey("Task-v0", "agent_0", "lm", task="ex3", replay_step=4))
    assert str(rae_regroup(replayed).group_id) == "feedback|s4|Task-v0|agent_0|lm|vs="


def test_per_state_baselines_credit_the_move_not_the_position() -> None:
    """``rae_per_state``: each one-turn row is measured against the mean return from its own
    prompt (starting at its role's baseline), so a won position's turns stop getting credit for
    the position, while the role baseline (folded by every row) still follows the win rate."""
    from agentrt.algos.rae import state_key, state_parent
    from agentrt.controller.objectives import rae_regroup
    from agentrt.core.types import Trajectory, Turn

    env = 'TicTacToe-v0{"compact": true}'
    role = GroupKey(env, "player_1", "lm", opponents=("minimax",))

    def row(prompt: list[int]) -> Trajectory:
        return rae_regroup(Trajectory([Turn(prompt, [2], [0.0])], info={"opponents": ["minimax"]},
                                      group_id=role), per_state=True)

    won, lost = row([1, 5, 7]).group_id, row([1, 5, 8]).group_id
    assert won != lost and state_parent(won) == state_parent(lost) == role
    assert GroupKey.parse(str(won)) == won  # checkpoints keep the keys as strings
    assert state_key(role, [1, 5, 7]) == won and state_parent(role) is None
    assert rae_regroup(Trajectory([Turn([1], [2], [0.0]), Turn([1, 2, 3], [4], [0.0])],
                                  info={"opponents": ["minimax"]}, group_id=role),
                       per_state=True).group_id == role  # a whole game in one row: no state
    state = RAEState(alpha=0.5)
    groups, scores = [won, lost] * 20, [1.0, -1.0] * 20
    with use_rae_state(state):
        adv, _ = ADVANTAGES.get("rae")(_inputs(scores, groups),
                                            AlgorithmConfig(advantage="rae"))
    first = adv[:2, 4].tolist()
    assert first == [1.0, -1.5]  # each starts at the role's baseline then: 0, then 0.5
    assert adv[-2:, 4].abs().max() < 1e-3  # then each state's own mean return
    assert abs(state.baseline(role)) < 0.5  # the role line folds every row
