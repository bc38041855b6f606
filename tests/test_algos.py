"""Every estimator, loss and KL piece against values computed by hand (padding and masking on)."""

from __future__ import annotations

import math

import pytest
import torch

from agentrt.algos import ADVANTAGES, KL_CONTROLLERS, KL_ESTIMATORS, POLICY_LOSSES
from agentrt.algos.advantages import AdvantageInputs, masked_whiten
from agentrt.algos.losses import aggregate, entropy_from_logits
from agentrt.algos.config import AlgorithmConfig, KLConfig
from agentrt.core.registry import Registry
from agentrt.core.types import GroupKey


def algo(**kw):
    return AlgorithmConfig(**kw)


def test_gae_by_hand_with_padding_and_env_tokens():
    cfg = algo(name="ppo", gamma=0.9, lam=0.8, norm_adv=False)
    rewards = torch.tensor([[0, 0, 0, 1.0], [0, 0, 0, 1.0], [0, 0, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1.0], [0, 1, 0, 1.0], [0, 0, 0, 0]])  # row 2 is padding
    values = torch.tensor([[0, 0.5, 0.6, 0.7], [0, 0.5, 9.0, 0.7], [3, 3, 3, 3.0]])
    adv, ret = ADVANTAGES.get("gae")(AdvantageInputs(rewards, mask, ["a", "b", "c"], values), cfg)
    # row 0: A3 = 1 - .7 = .3; A2 = (.9*.7 - .6) + .72*.3 = .246; A1 = (.9*.6 - .5) + .72*.246
    exp0 = [0.0, 0.04 + 0.72 * 0.246, 0.246, 0.3]
    # row 1: token 2 is an observation token, skipped: A1 = (.9*.7 - .5) + .72*.3
    exp1 = [0.0, 0.13 + 0.72 * 0.3, 0.0, 0.3]
    torch.testing.assert_close(adv, torch.tensor([exp0, exp1, [0.0] * 4]), atol=1e-6, rtol=0)
    torch.testing.assert_close(ret[0], torch.tensor(exp0) + values[0] * mask[0], atol=1e-6,
                               rtol=0)
    assert ret[2].abs().sum() == 0


def test_gae_whitening_is_over_masked_tokens_only():
    cfg = algo(name="ppo", norm_adv=True)
    rewards = torch.tensor([[0, 0, 2.0], [0, 1.0, 0]])
    mask = torch.tensor([[0, 1, 1.0], [0, 1, 0.0]])
    adv, _ = ADVANTAGES.get("gae")(AdvantageInputs(rewards, mask, ["a", "b"],
                                                   torch.zeros(2, 3)), cfg)
    picked = adv[mask > 0]
    assert abs(float(picked.mean())) < 1e-6
    assert abs(float(picked.std()) - 1.0) < 1e-4
    assert adv[1, 2] == 0


@pytest.mark.parametrize("norm_std, expected", [(True, 0.5 / math.sqrt(1 / 3)), (False, 0.5)])
def test_grpo_by_hand(norm_std, expected):
    cfg = algo(norm_std=norm_std, eps=1e-12)
    rewards = torch.zeros(5, 3)
    rewards[:, 2] = torch.tensor([1.0, 0, 0, 1, 2])
    mask = torch.tensor([[0, 1, 1.0]] * 4 + [[0, 1, 1.0]])
    mask[1, 2] = 0  # a shorter (padded) response: reward moved to its last token
    rewards[1, 1], rewards[1, 2] = rewards[1, 2], 0
    adv, _ = ADVANTAGES.get("grpo")(AdvantageInputs(rewards, mask, ["g"] * 4 + ["solo"]), cfg)
    signs = torch.tensor([1.0, -1, -1, 1])
    torch.testing.assert_close(adv[:4, 1], signs * expected, atol=1e-5, rtol=0)
    assert adv[1, 2] == 0 and adv[:, 0].abs().sum() == 0
    assert adv[4].abs().sum() == 0  # a group of one has no baseline


def test_grpo_never_mixes_groups():
    cfg = algo()
    rewards = torch.tensor([[0, 1.0], [0, 0.0], [0, 5.0], [0, 5.0]])
    p0, p1 = (GroupKey("x", "agent", p, task="ex0") for p in ("p0", "p1"))
    adv, _ = ADVANTAGES.get("grpo")(AdvantageInputs(rewards, torch.tensor([[0, 1.0]] * 4),
                                                    [p0, p0, p1, p1]), cfg)
    assert adv[2:].abs().sum() == 0  # equal rewards within its own group: no signal
    assert adv[0, 1] > 0 > adv[1, 1]


def test_group_keys_round_trip_through_their_plain_form():
    """``str(key)`` is the group id agentrt wrote before keys were typed (checkpoints, the
    episode log); :meth:`GroupKey.parse` reads every form back to an equal key."""
    env = 'TicTacToe-v0{"compact": true}'
    keys = {
        "Task-v0|agent_0|lm|ex3": GroupKey("Task-v0", "agent_0", "lm", task="ex3"),
        "Maze-v0|agent|lm|seed=7": GroupKey("Maze-v0", "agent", "lm", seed=7),
        f"{env}|player_1|lm|vs=lm@25,random": GroupKey(env, "player_1", "lm",
                                                       opponents=("lm@25", "random")),
        "Solo-v0|agent|lm|vs=": GroupKey("Solo-v0", "agent", "lm", opponents=()),
        "ttt|player_0|lm": GroupKey("ttt", "player_0", "lm"),
        "feedback|s4|Task-v0|agent_0|lm|ex3": GroupKey("Task-v0", "agent_0", "lm", task="ex3",
                                                       replay_step=4),
        "Maze-v0|agent|lm|seed=07": GroupKey("Maze-v0", "agent", "lm", task="seed=07"),
    }
    for text, key in keys.items():
        assert str(key) == text and GroupKey.parse(text) == key
    assert sorted(keys.values()) == [keys[t] for t in sorted(keys)]  # keys sort like the ids
    with pytest.raises(ValueError, match="'prompt-17' is not '<env>"):
        GroupKey.parse("prompt-17")
    with pytest.raises(ValueError, match="at most one of task, seed and opponents"):
        GroupKey("ttt", "player_0", "lm", task="ex0", seed=1)


def test_rloo_by_hand():
    rewards = torch.tensor([[0, 1.0], [0, 0], [0, 0], [0, 1.0]])
    adv, _ = ADVANTAGES.get("rloo")(AdvantageInputs(rewards, torch.tensor([[0, 1.0]] * 4),
                                                    ["g"] * 4), algo())
    # s0 = 1, mean of the others = 1/3 -> 2/3
    torch.testing.assert_close(adv[:, 1], torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))


def test_reinforce_pp_by_hand():
    rewards = torch.tensor([[0, 0, 1.0], [0, 0, 0]])
    mask = torch.tensor([[0, 1, 1.0], [0, 1, 0]])
    adv, ret = ADVANTAGES.get("reinforce++")(AdvantageInputs(rewards, mask, ["a", "b"]),
                                             algo(gamma=1.0, eps=1e-12))
    torch.testing.assert_close(ret, torch.tensor([[0, 1, 1.0], [0, 0, 0]]))
    s = math.sqrt(1 / 3)  # masked returns [1, 1, 0]: mean 2/3, unbiased var 1/3
    torch.testing.assert_close(adv, torch.tensor([[0, (1 / 3) / s, (1 / 3) / s],
                                                  [0, -(2 / 3) / s, 0]]), atol=1e-5, rtol=0)


def test_reinforce_pp_discount():
    rewards = torch.tensor([[0, 0, 0, 1.0]])
    mask = torch.tensor([[0, 1, 1, 1.0]])
    _, ret = ADVANTAGES.get("reinforce++")(AdvantageInputs(rewards, mask, ["a"]), algo(gamma=0.5))
    torch.testing.assert_close(ret, torch.tensor([[0, 0.25, 0.5, 1.0]]))


def test_ppo_clip_by_hand():
    cfg = algo(clip_ratio_low=0.2, clip_ratio_high=0.2)
    ratios = torch.tensor([[1.0, 1.5, 0.5, 1.1, 7.0]])
    old = torch.zeros(1, 5)
    adv = torch.tensor([[9.0, 1.0, -1.0, 1.0, 4.0]])
    mask = torch.tensor([[0, 1, 1, 1, 0.0]])  # first and last tokens are prompt/padding
    loss, m = POLICY_LOSSES.get("ppo")(ratios.log(), old, adv, mask, cfg)
    torch.testing.assert_close(loss, torch.tensor([[0, -1.2, 0.8, -1.1, 0]]), atol=1e-6, rtol=0)
    assert m["actor/clipfrac"] == pytest.approx(2 / 3)


def test_dual_clip_caps_negative_advantages():
    cfg = algo(clip_ratio_c=3.0)
    ratios = torch.tensor([[5.0, 5.0]])
    adv = torch.tensor([[-1.0, 1.0]])
    loss, _ = POLICY_LOSSES.get("ppo")(ratios.log(), torch.zeros(1, 2), adv, torch.ones(1, 2), cfg)
    # A<0: max(5, 1.2) = 5 capped to -A*c = 3; A>0: max(-5, -1.2) = -1.2 (dual clip not applied)
    torch.testing.assert_close(loss, torch.tensor([[3.0, -1.2]]))


def test_aggregations_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1.0], [1, 0, 0]])
    assert float(aggregate(loss, mask, "token-mean")) == pytest.approx(10 / 4)
    assert float(aggregate(loss, mask, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(aggregate(loss, mask, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)
    # micro-batches with the mini-batch denominators add up to the whole
    parts = sum(aggregate(loss[i:i + 1], mask[i:i + 1], "token-mean", num_tokens=4.0)
                for i in range(2))
    assert float(parts) == pytest.approx(10 / 4)


def test_ppo_at_ratio_one_has_the_vanilla_policy_gradient():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7, requires_grad=True)
    ids = torch.randint(0, 7, (3, 5))
    adv = torch.randn(3, 5)
    mask = torch.tensor([[0, 1, 1, 1, 1.0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 1]])

    def grad(name):
        logp = torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1)
        token, _ = POLICY_LOSSES.get(name)(logp, logp.detach(), adv, mask, algo())
        (g,) = torch.autograd.grad(aggregate(token, mask, "token-mean"), logits)
        return g

    torch.testing.assert_close(grad("ppo"), grad("vanilla"), atol=1e-7, rtol=0)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    assert float(KL_ESTIMATORS.get("k1")(logp, ref)) == pytest.approx(1.0)
    assert float(KL_ESTIMATORS.get("k2")(logp, ref)) == pytest.approx(0.5)
    assert float(KL_ESTIMATORS.get("k3")(logp, ref)) == pytest.approx(math.exp(-1) + 1 - 1)


def test_k3_is_unbiased_for_the_true_kl():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(6), 0)
    q = torch.softmax(torch.randn(6), 0)
    samples = torch.multinomial(p, 200_000, replacement=True)
    est = KL_ESTIMATORS.get("k3")(p.log()[samples], q.log()[samples]).mean()
    true = (p * (p.log() - q.log())).sum()
    assert float(est) == pytest.approx(float(true), rel=0.03)


def test_k3_is_clamped_like_verls_low_var_kl():
    """verl kl_penalty("low_var_kl"): clamp(exp(ref - logp) - (ref - logp) - 1, -10, 10)."""
    k3 = KL_ESTIMATORS.get("k3")
    logp = torch.zeros(6)
    ref = torch.tensor([15.0, 40.0, 1e4, -15.0, -40.0, -1e4])  # runaway log-ratios both ways
    out = k3(logp, ref)
    assert torch.isfinite(out).all() and (out >= -10).all() and (out <= 10).all()
    assert float(out[0]) == 10.0  # unclamped: exp(15) - 16 = 3.3e6
    assert float(out[3]) == pytest.approx(10.0)  # unclamped: exp(-15) + 14 = 14.0
    moderate = torch.linspace(-10.5, 2.5, 27)  # log r where k3 < 10: the exact formula
    unclamped = torch.exp(moderate) - moderate - 1
    torch.testing.assert_close(k3(torch.zeros(27), moderate), unclamped)


def test_kl_controllers():
    fixed = KL_CONTROLLERS.get("fixed")(KLConfig(coef=0.1))
    fixed.update(5.0, 10)
    assert fixed.coef == 0.1
    adaptive = KL_CONTROLLERS.get("adaptive")(KLConfig(coef=0.1, controller="adaptive",
                                                       target=0.1, horizon=100))
    adaptive.update(0.2, 10)  # error clipped to +0.2 -> beta * (1 + 0.2 * 10 / 100)
    assert adaptive.coef == pytest.approx(0.1 * 1.02)
    adaptive.update(0.09, 10)  # error -0.1 -> beta * (1 - 0.01)
    assert adaptive.coef == pytest.approx(0.1 * 1.02 * 0.99)


def test_decay_controller_halves_after_half_life_and_resumes_where_it_was():
    cfg = KLConfig(coef=0.3, controller="decay", half_life=100)
    decay = KL_CONTROLLERS.get("decay")(cfg)
    assert decay.coef == 0.3
    for _ in range(100):
        decay.update(0.5, 128)  # the KL and batch size play no part
    assert decay.coef == pytest.approx(0.15)
    resumed = KL_CONTROLLERS.get("decay")(cfg)
    resumed.load_state_dict(decay.state_dict())
    for ctl in (decay, resumed):
        for _ in range(200):
            ctl.update(0.0, 1)
    assert decay.coef == resumed.coef == pytest.approx(0.3 * 100 / 400)


def test_entropy_and_whiten():
    logits = torch.zeros(1, 1, 4)
    assert float(entropy_from_logits(logits)) == pytest.approx(math.log(4))
    # The entropy a token carries is that of the softmax it was sampled from (the previous
    # position's logits), the same alignment as its log-prob.
    from agentrt.runtime.steps import shift_entropy, shift_logprobs

    sharp = torch.full((4,), -30.0).index_fill(0, torch.tensor([2]), 30.0)
    seq = torch.stack([torch.zeros(4), sharp, torch.zeros(4)])[None]  # [1, 3, 4]
    ent = shift_entropy(seq)
    assert ent[0, 0] == 0 and ent[0, 1] == pytest.approx(math.log(4)) and ent[0, 2] < 1e-6
    assert shift_logprobs(seq, torch.tensor([[0, 1, 2]]))[0, 2] > -1e-6
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    w = masked_whiten(x, torch.tensor([1, 1, 1, 0.0]))
    torch.testing.assert_close(w, torch.tensor([-1.0, 0.0, 1.0, 0.0]), atol=1e-4, rtol=0)


def test_registry_rejects_duplicates_and_lists_valid_names():
    reg: Registry[int] = Registry("thing")
    reg.add("a", 1)
    with pytest.raises(KeyError, match="already registered"):
        reg.add("a", 2)
    with pytest.raises(KeyError, match="valid: a"):
        reg.get("b")
    assert {"gae", "grpo", "rloo", "reinforce++"} <= set(ADVANTAGES.names())


def test_registry_imports_an_unregistered_module_path():
    """'package.module:attr' needs no registration; a path to nothing is a ConfigError and is
    not kept (a later fix of the module is found)."""
    from agentrt.core.errors import ConfigError

    reg: Registry[object] = Registry("thing")
    assert reg.get("math:sqrt") is math.sqrt and "math:sqrt" in reg
    with pytest.raises(ConfigError, match="thing 'math:nothing': 'math' has no function"):
        reg.get("math:nothing")
    assert "math:nothing" not in reg
    with pytest.raises(ConfigError, match="cannot import module 'no_such_mod'"):
        reg.get("no_such_mod:f")
