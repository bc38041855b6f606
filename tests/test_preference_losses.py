"""Preference losses against their formulas computed by hand (prompt tokens and padding masked),
and DPO's small-beta gradient against the gradient of the log-ratio difference."""

from __future__ import annotations

import math

import pytest
import torch

from agentrt.algos import PREFERENCE_LOSSES
from agentrt.algos.preference import PreferenceIndex, sequence_logps
from agentrt.algos.config import AlgorithmConfig
from agentrt.runtime.losses import preference_loss


def softplus(x: float) -> float:
    """-log sigmoid(-x) = log(1 + e^x)."""
    return math.log1p(math.exp(x))


def nls(x: float) -> float:
    """-log sigmoid(x)."""
    return softplus(-x)


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# Five responses: a pair (rows 0 > 1) and a ranked list of three (rows 2, 3, 4 with ranks
# 1, 0, 2). Column 0 is a prompt position and trailing 7.0s are padding: both must be ignored.
TOKEN_LOGPS = torch.tensor([
    [9.0, -1.0, -0.5, 7.0],
    [9.0, -2.0, 7.0, 7.0],
    [9.0, -0.3, -0.2, -0.1],
    [9.0, -1.0, 7.0, 7.0],
    [9.0, 9.0, -3.0, 7.0],  # a two-token prompt
])
MASK = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 1, 0.0]])
REF = torch.tensor([-1.0, -1.0, -0.5, -1.2, -2.0])
# by hand: policy sums [-1.5, -2.0, -0.6, -1.0, -3.0]; r = policy - ref:
R = [-0.5, -1.0, -0.1, 0.2, -1.0]
RANKS = [[0, 1], [1, 0, 2]]


def run(name: str, pairs: str = "all", desirable=None, **cfg):
    algo = AlgorithmConfig(name=name, **cfg)
    policy = sequence_logps(TOKEN_LOGPS, MASK)
    torch.testing.assert_close(policy, torch.tensor([-1.5, -2.0, -0.6, -1.0, -3.0]))
    index = PreferenceIndex.build(RANKS, desirable, pairs)
    return PREFERENCE_LOSSES.get(algo.preference_loss)(policy, REF, index, algo)


def pair_terms(f) -> list[float]:
    """Per-group mean of f(h) over the pairs: group 0 (0>1), group 1 (3>2, 3>4, 2>4)."""
    g0 = f(R[0] - R[1])
    g1 = (f(R[3] - R[2]) + f(R[3] - R[4]) + f(R[2] - R[4])) / 3
    return [g0, g1]


def test_index_pairs_from_ranks():
    index = PreferenceIndex.build(RANKS)
    assert sorted(index.pairs.tolist()) == [[0, 1], [2, 4], [3, 2], [3, 4]]
    assert index.group.tolist() == [0, 0, 1, 1, 1]
    assert index.desirable.tolist() == [1, 0, 0, 1, 0]
    assert PreferenceIndex.build(RANKS, pairs="best_worst").pairs.tolist() == [[0, 1], [3, 4]]
    rows, sub = index.rows_of([1])
    assert rows == [2, 3, 4] and sorted(sub.pairs.tolist()) == [[0, 2], [1, 0], [1, 2]]
    assert sub.group.tolist() == [0, 0, 0] and sub.num_groups == 1


def test_dpo_sigmoid_by_hand():
    loss, m = run("dpo", beta=0.5)
    torch.testing.assert_close(loss, torch.tensor(pair_terms(lambda h: nls(0.5 * h))))
    # metrics over the 4 pairs: implicit rewards beta * r
    chosen, rejected = [R[0], R[3], R[3], R[2]], [R[1], R[2], R[4], R[4]]
    assert m["pref/chosen_reward"] == pytest.approx(0.5 * sum(chosen) / 4)
    assert m["pref/rejected_reward"] == pytest.approx(0.5 * sum(rejected) / 4)
    assert m["pref/margin"] == pytest.approx(0.5 * (sum(chosen) - sum(rejected)) / 4)
    assert m["pref/accuracy"] == 1.0  # every chosen has the larger log-ratio
    assert m["pref/kl"] == pytest.approx(sum(R) / 5)


def test_conservative_dpo_label_smoothing_by_hand():
    eps, beta = 0.1, 0.5
    loss, _ = run("dpo", beta=beta, label_smoothing=eps)
    expected = pair_terms(lambda h: (1 - eps) * nls(beta * h) + eps * nls(-beta * h))
    torch.testing.assert_close(loss, torch.tensor(expected))


def test_ipo_by_hand():
    beta = 0.25
    loss, _ = run("ipo", beta=beta)
    torch.testing.assert_close(loss, torch.tensor(pair_terms(lambda h: (h - 2.0) ** 2)))


def test_dpo_best_worst_pairs_by_hand():
    loss, m = run("dpo", pairs="best_worst", beta=0.5)
    torch.testing.assert_close(loss, torch.tensor([nls(0.5 * (R[0] - R[1])),
                                                   nls(0.5 * (R[3] - R[4]))]))


def test_plackett_luce_by_hand():
    beta = 0.5
    loss, _ = run("listwise", beta=beta)
    s = {i: beta * R[i] for i in range(5)}
    lse = lambda *xs: math.log(sum(math.exp(x) for x in xs))  # noqa: E731
    g0 = -(s[0] - lse(s[0], s[1]))  # two responses: exactly DPO
    g1 = -((s[3] - lse(s[3], s[2], s[4])) + (s[2] - lse(s[2], s[4])))  # order 3, 2, 4
    torch.testing.assert_close(loss, torch.tensor([g0, g1]))
    assert g0 == pytest.approx(nls(beta * (R[0] - R[1])))


def test_kto_by_hand_with_reference_point_clamped_at_zero():
    loss, m = run("kto", beta=0.5, kto_desirable_weight=2.0, kto_undesirable_weight=0.5)
    z0 = max(0.0, sum(R) / 5)
    assert z0 == 0.0 and m["pref/kto_z0"] == 0.0  # mean log-ratio is negative here
    d = lambda r: 2.0 * (1 - sig(0.5 * (r - z0)))  # noqa: E731
    u = lambda r: 0.5 * (1 - sig(0.5 * (z0 - r)))  # noqa: E731
    # desirable = best rank of each example: rows 0 and 3
    expected = [(d(R[0]) + u(R[1])) / 2, (u(R[2]) + d(R[3]) + u(R[4])) / 3]
    torch.testing.assert_close(loss, torch.tensor(expected))


def test_kto_unpaired_rows_with_positive_reference_point():
    algo = AlgorithmConfig(name="kto", beta=1.0)
    policy = sequence_logps(TOKEN_LOGPS[:3], MASK[:3])  # [-1.5, -2.0, -0.6]
    ref = torch.tensor([-2.5, -2.0, -1.6])  # r = [1.0, 0.0, 1.0] -> z0 = 2/3
    index = PreferenceIndex.build([[0], [0], [0]], [[1.0], [0.0], [0.0]])
    loss, m = PREFERENCE_LOSSES.get("kto")(policy, ref, index, algo)
    z0 = 2 / 3
    expected = [1 - sig(1.0 - z0), 1 - sig(z0 - 0.0), 1 - sig(z0 - 1.0)]
    torch.testing.assert_close(loss, torch.tensor(expected))
    assert m["pref/kto_z0"] == pytest.approx(z0)
    assert m["pref/chosen_reward"] == pytest.approx(1.0)
    assert m["pref/rejected_reward"] == pytest.approx(0.5)
    assert "pref/accuracy" not in m  # no pairs to be right about


def test_unpaired_flag_only_on_kto():
    assert [n for n in PREFERENCE_LOSSES if PREFERENCE_LOSSES.get(n).accepts_unpaired] == ["kto"]


def test_dpo_small_beta_gradient_is_the_log_ratio_difference_direction(tiny_model_dir):
    """grad DPO = -beta sigma(-beta h) grad h per pair -> -(beta / 2) grad sum(h) as beta -> 0."""
    from agentrt.policies.models import load_model
    from agentrt.runtime.preference import make_batch, PreferenceExample
    from agentrt.runtime.steps import shift_logprobs

    torch.manual_seed(0)
    model, tok = load_model(tiny_model_dir)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    examples = [PreferenceExample(p, [[tok.bos_token_id] + enc(p)] * 2,
                                  [enc(c) + [tok.eos_token_id], enc(r) + [tok.eos_token_id]],
                                  [0, 1])
                for p, c, r in [("1+2=", "3", "4"), ("10+25=", "35", "36"), ("7+7=", "14", "4")]]
    batch = make_batch(examples, tok.pad_token_id)
    params = [p for p in model.parameters() if p.requires_grad]

    def policy_logps():
        logits = model(input_ids=batch.seqs.input_ids,
                       attention_mask=batch.seqs.attention_mask).logits
        return sequence_logps(shift_logprobs(logits, batch.seqs.input_ids), batch.seqs.loss_mask)

    # A reference far from the policy, so the pairs' h differ a lot (-8, 0, +8 nats).
    with torch.no_grad():
        lp = policy_logps()
    ref = lp.clone()
    ref[0::2] += torch.tensor([8.0, 0.0, -8.0])

    def grad(loss_of):
        model.zero_grad()
        loss_of(policy_logps()).backward()
        return torch.cat([p.grad.flatten() for p in params])

    def dpo(beta):
        algo = AlgorithmConfig(name="dpo", beta=beta)
        return lambda pol: PREFERENCE_LOSSES.get("dpo")(pol, ref, batch.index, algo)[0].sum()

    r_c, r_l = batch.index.pairs[:, 0], batch.index.pairs[:, 1]
    neg_h = grad(lambda pol: -((pol - ref)[r_c] - (pol - ref)[r_l]).sum())
    cos = lambda a, b: float(a @ b / (a.norm() * b.norm()))  # noqa: E731
    assert cos(grad(dpo(1e-4)), neg_h) > 0.9999
    assert cos(grad(dpo(1.0)), neg_h) < 0.99  # at beta 1 the pairs are weighted unequally


def test_chosen_nll_term_adds_the_per_token_nll_of_the_best_responses(tiny_model_dir):
    """RPO: loss = preference loss + coef * mean over examples of -log p(best) / its length."""
    from agentrt.config.sections import PolicyConfig
    from agentrt.runtime.learner import Learner
    from agentrt.runtime.preference import PreferenceExample, make_batch

    def engine(coef):
        return Learner(PolicyConfig(model={"path": str(tiny_model_dir)}, algorithm={
            "name": "dpo", "online": False, "chosen_nll_coef": coef}), seed=0)

    def policy_logprobs(learner, batch):  # the learner's forward pass, as its update runs it
        return learner.passes.forward(learner.model, batch.seqs, scaled=False).logprobs()

    plain, rpo = engine(0.0), engine(0.5)
    tok = plain.tokenizer
    examples = [PreferenceExample("", [[1, 30, 31]] * 2, [[40, 41, 2], [42, 2]], [0, 1]),
                PreferenceExample("", [[1, 33]] * 3, [[43, 2], [44, 45, 46, 2], [47, 2]],
                                  [1, 0, 2])]
    batch = make_batch(examples, tok.pad_token_id)
    batch.ref_logps = torch.tensor([-3.0, -2.0, -1.0, -4.0, -2.5])
    base, _ = preference_loss(policy_logprobs(plain, batch), batch, plain.algo, 2.0)
    with_nll, m = preference_loss(policy_logprobs(rpo, batch), batch, rpo.algo, 2.0)
    lp = sequence_logps(plain.logprobs(batch.seqs, scaled=False), batch.seqs.loss_mask)
    nll_best = [-float(lp[0]) / 3, -float(lp[3]) / 4]  # row 0 (3 tokens), row 3 (4 tokens)
    expected = float(base) + 0.5 * sum(nll_best) / 2
    assert float(with_nll) == pytest.approx(expected, rel=1e-5)
    assert m["pref/chosen_nll"] == pytest.approx(sum(nll_best) / 2, rel=1e-5)
