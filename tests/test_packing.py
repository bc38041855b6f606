"""Token-budget micro-batches and sequence packing: the same numbers as padded rows, less padding."""

from __future__ import annotations

import random

import pytest
import torch

from agentrt.algos.config import AlgorithmConfig
from agentrt.config.load import validate_config
from agentrt.config.sections import LoraConfig
from agentrt.core.errors import ConfigError
from agentrt.runtime import packing
from agentrt.runtime.packing import layout, plan_micro_batches
from agentrt.core.types import Trajectory, Turn, collate
from agentrt.workloads.prompts.config import TrainConfig
from test_engine import advantages, make_engine, params_of

BUDGET = 96  # small enough that rows of several lengths need several micro-batches


def varied_batch(pad_id: int, n: int = 24, seed: int = 0):
    """Rows of 3 to 34 tokens (prompts 2-14, responses 1-20), so packing has short rows to
    share a row with and padded rows waste up to 90% of their positions. Every other group of 4
    rows has one prompt (as GRPO's do), the others a prompt per row, so prefix sharing has both."""
    rng = random.Random(seed)
    trajs = []
    for i in range(n):
        if i % 8 == 0 or i % 8 >= 4:
            prompt = [1] + [rng.randrange(3, 250) for _ in range(rng.randint(1, 13))]
        response = [rng.randrange(3, 250) for _ in range(rng.randint(1, 20))]
        trajs.append(Trajectory([Turn(prompt, response, [-1.0] * len(response),
                                      reward=float(rng.random() < 0.5))], group_id=str(i // 4)))
    return collate(trajs, pad_id)


ARMS = {"padded": {"packing": False},
        "bucketed": {"micro_batch_tokens": BUDGET, "packing": False},
        "packed": {"micro_batch_tokens": BUDGET, "packing": True, "share_prefix": False},
        "shared": {"micro_batch_tokens": BUDGET, "packing": True}}


def update_steps(engines: dict, batch) -> tuple[dict, dict]:
    """Each engine's GRPO update on a copy of ``batch`` from the same weights: per engine the
    flattened weight change and the update's metrics."""
    before = params_of(next(iter(engines.values())))
    steps, metrics = {}, {}
    for name, eng in engines.items():
        b = batch.select(list(range(batch.size)))
        eng.prepare(b)
        advantages(eng, b)
        metrics[name] = eng.update(b)
        steps[name] = torch.cat([(p - before[k]).flatten() for k, p in params_of(eng).items()])
    return steps, metrics


@pytest.mark.parametrize("lora", [False, True])
def test_packed_and_bucketed_logprobs_equal_the_padded_ones(tiny_model_dir, lora):
    engines = {arm: make_engine(tiny_model_dir, lora=LoraConfig(enabled=lora),
                                rollout={"sampling": {"temperature": 0.7}}, **kw)
               for arm, kw in ARMS.items()}
    batch = varied_batch(engines["padded"].pad_id)
    lay = layout(batch.input_ids, batch.attention_mask, True, 0)
    assert lay.input_ids.shape[0] < batch.size  # short sequences really share rows
    out = {}
    for arm, eng in engines.items():
        eng.passes.padding_metrics()  # the engine's own start-up probe is not this batch's
        out[arm] = (eng.logprobs(batch), eng.passes.padding_metrics())
    padded_lp, padded = out["padded"]
    assert padded_lp.abs().sum() > 0
    for arm in ("bucketed", "packed", "shared"):
        torch.testing.assert_close(out[arm][0], padded_lp, atol=2e-5, rtol=0)
    assert out["shared"][1]["perf/shared_tokens"] > 0
    assert out["packed"][1]["perf/shared_tokens"] == 0
    # length buckets keep a prompt's rows together (rows 0-3, 8-11, 16-19 share one each)
    parts = engines["shared"].passes.micro_batches(batch)
    assert len(parts) > 1
    for first in (0, 8, 16):
        assert any(set(range(first, first + 4)) <= set(part) for part in parts)


def test_rows_of_one_prompt_compute_it_once(monkeypatch):
    rng = random.Random(4)
    trajs = []
    for g in range(3):  # 3 prompts of 6 tokens, 4 responses of 3 each; one row alone
        prompt = [1] + [rng.randrange(3, 250) for _ in range(5)]
        trajs += [Trajectory([Turn(prompt, [rng.randrange(3, 250) for _ in range(3)], [-1.0] * 3)],
                             group_id=str(g)) for _ in range(4)]
    trajs.append(Trajectory([Turn([1, 7, 8], [9, 10], [-1.0] * 2)], group_id="3"))
    batch = collate(trajs, 0)
    prefix = batch.loss_mask.argmax(-1)
    lay = layout(batch.input_ids, batch.attention_mask, True, 0, prefix)  # hidden 0: positions
    assert lay.shared == 3 * 3 * 6  # 3 of each prompt's 4 copies
    assert lay.tokens == int(batch.attention_mask.sum()) - lay.shared
    # the 4D mask: every token attends to as many keys as in its own row (its prompt and its
    # own earlier tokens, never a neighbour's completion)
    seen = lay.attention_mask[:, 0].sum(-1).flatten()[lay.src]
    t = torch.arange(batch.input_ids.shape[1]).expand_as(batch.input_ids)
    assert torch.equal(seen, (t + 1)[batch.attention_mask.bool() & (t > 0)])
    # the mask's memory is bounded: no shared segment wider than SHARE_MAX_WIDTH (6 + 2 x 3 > 11)
    monkeypatch.setattr(packing, "SHARE_MAX_WIDTH", 11)
    capped = layout(batch.input_ids, batch.attention_mask, True, 0, prefix)
    assert capped.shared == 0 and capped.attention_mask is None


def grpo_batch(response: int, groups: int = 4, size: int = 8, seed: int = 5):
    """``groups`` prompts of 7 tokens, ``size`` responses of ``response`` tokens each."""
    rng = random.Random(seed)
    trajs = []
    for g in range(groups):
        prompt = [1] + [rng.randrange(3, 250) for _ in range(6)]
        trajs += [Trajectory([Turn(prompt, [rng.randrange(3, 250) for _ in range(response)],
                                   [-1.0] * response)], group_id=str(g)) for _ in range(size)]
    return collate(trajs, 0)


@pytest.mark.parametrize("response,hidden,width", [
    (6, 256, 7 + 8 * 6),  # short responses: a group's 8 rows share one segment
    (32, 0, 7 + 8 * 32),  # positions only: the fewest positions, whole groups
    (32, 256, 7 + 4 * 32),  # the dense mask over 263 positions costs more than 7 x 4 saves
    (32, 1024, 7 + 8 * 32),  # a wide model: its matmuls per position outweigh the attention
])
def test_shared_segments_are_cut_where_attention_costs_more(response, hidden, width):
    batch = grpo_batch(response)
    prefix = batch.loss_mask.argmax(-1)
    lay = layout(batch.input_ids, batch.attention_mask, True, 0, prefix, hidden)
    assert lay.input_ids.shape[1] == width
    k = (width - 7) // response  # rows per segment, each segment computing its prompt once
    assert lay.shared == 4 * 7 * (8 - 8 // k)


def test_grpo_update_with_packing_gives_the_same_weights(tiny_model_dir):
    # AdamW's first step is lr * g / (|g| + eps): with eps 1 it is ~lr * g, so the weights
    # compare the gradients (with eps 1e-8 it is ~lr * sign(g), which rounding flips where g ~ 0)
    optim = {"lr": 1.0, "eps": 1.0}
    algo = AlgorithmConfig(entropy_coef=0.01)  # the entropy's gradient too
    engines = {arm: make_engine(tiny_model_dir, algorithm=algo, optim=optim, **kw)
               for arm, kw in ARMS.items()}
    batch = varied_batch(engines["padded"].pad_id, n=16, seed=1)
    steps, metrics = update_steps(engines, batch)
    scale = float(steps["padded"].abs().max())
    assert scale > 1e-4
    for arm in ("bucketed", "packed", "shared"):
        assert float((steps[arm] - steps["padded"]).abs().max()) <= 1e-4 * scale, arm
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
            assert metrics[arm][key] == pytest.approx(metrics["padded"][key], rel=1e-4, abs=1e-7)
    assert metrics["packed"]["perf/pad_fraction"] < metrics["padded"]["perf/pad_fraction"]


def test_critic_values_are_the_same_packed(tiny_model_dir):
    ppo = AlgorithmConfig(name="ppo")
    engines = [make_engine(tiny_model_dir, algorithm=ppo, **kw)
               for kw in (ARMS["padded"], ARMS["packed"])]
    for eng in engines:  # a critic head at 0 gives 0 everywhere: make it read the body
        torch.nn.init.normal_(eng.critic.head.weight, generator=torch.Generator().manual_seed(0))
    batch = varied_batch(engines[0].pad_id, seed=2)
    padded, packed = (eng.passes.values(eng.critic, batch) for eng in engines)
    assert padded.abs().sum() > 0
    torch.testing.assert_close(packed, padded, atol=2e-5, rtol=0)


def test_token_budget_plans_cover_every_row_within_the_budget():
    rng = random.Random(3)
    lengths = [rng.randint(1, 40) for _ in range(200)] + [90]  # one row longer than the budget
    for packed in (False, True):
        parts = plan_micro_batches(lengths, max_rows=16, max_tokens=64, packed=packed)
        assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
        for part in parts:
            cost = sum(lengths[i] for i in part) if packed else \
                len(part) * max(lengths[i] for i in part)
            assert len(part) <= 16 and (cost <= 64 or len(part) == 1)
    assert plan_micro_batches(lengths[:5], max_rows=2) == [[0, 1], [2, 3], [4]]
    # entries standing for several rows (a shared prompt's group) count them against max_rows
    assert plan_micro_batches([9, 8, 7], 4, 100, True, rows=[3, 1, 2]) == [[0, 1], [2]]


def test_rows_are_packed_first_fit_decreasing():
    def first_fit(lengths, width):  # the plain scan of open rows
        rows, free = [], []
        for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
            slot = next((r for r, f in enumerate(free) if f >= lengths[i]), None)
            if slot is None:
                rows.append([i])
                free.append(width - lengths[i])
            else:
                rows[slot].append(i)
                free[slot] -= lengths[i]
        return rows

    rng = random.Random(5)
    for n in (0, 1, 2, 7, 64, 300):
        lengths = [rng.randint(1, 64) for _ in range(n)]
        for width in (64, 100, 257):
            rows = packing.pack_rows(lengths, width)
            assert rows == first_fit(lengths, width)
            assert all(sum(lengths[i] for i in row) <= width for row in rows)


@pytest.mark.parametrize("policy, field", [({"micro_batch_tokens": 0}, "micro_batch_tokens"),
                                           ({"micro_batch_tokens": "lots"}, "micro_batch_tokens"),
                                           ({"packing": "maybe"}, "packing")])
def test_bad_budget_or_packing_is_one_message_naming_the_field(policy, field):
    with pytest.raises(ConfigError, match=f"policy.{field}"):
        validate_config({"policy": policy}, TrainConfig)


def test_sharing_a_prompt_without_packing_is_refused_by_name():
    with pytest.raises(ConfigError, match="policy: share_prefix: .* set packing: true"):
        validate_config({"policy": {"packing": False, "share_prefix": True}}, TrainConfig)
    validate_config({"policy": {"packing": False}}, TrainConfig)  # the default then shares nothing
