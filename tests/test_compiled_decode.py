"""policy.compile on the rollout: the static decoder's compiled decode step gives the eager
step's tokens and log-probs, in fp32 and under bf16 autocast, with batches of other sizes, prompt
widths and finished rows dropped mid-call compiled once; a second model of the same
architecture reuses those graphs; batches it does not run (mixed adapters, full-weight
snapshots) stay eager."""

from __future__ import annotations

import pytest
import torch
from agentrt.policies.models import build_model, load_model

from agentrt.config.rollout import SamplingConfig
from agentrt.runtime.rollout.compiled import plain_plan
from agentrt.runtime.rollout.static import StaticDecoder


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    model, tokenizer = load_model(build_model(tmp_path_factory.mktemp("m") / "m", "llama-tiny",
                                              seed=0))
    return model.eval(), tokenizer


def _prompts(tokenizer, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` left-padded prompts of 3 to 9 tokens."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(3, 250, (int(torch.randint(3, 10, (1,), generator=g)),), generator=g)
            for _ in range(n)]
    width = max(len(r) for r in rows)
    ids = torch.full((n, width), tokenizer.pad_token_id)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids, mask


def _pair(model, tokenizer, dtype):
    args = (model, tokenizer.pad_token_id, tokenizer.eos_token_id, dtype)
    return StaticDecoder(*args), StaticDecoder(*args, compile=True)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_compiled_decode_step_equals_the_eager_step(model, dtype):
    model, tokenizer = model
    eager, compiled = _pair(model, tokenizer, dtype)
    torch._dynamo.reset()
    frames = torch._dynamo.utils.counters["stats"]
    before = frames["unique_graphs"]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=12)
    sampled = SamplingConfig(temperature=1.0, max_new_tokens=12)
    # batch sizes and prompt widths change between calls; sampled rows finish at different
    # steps, so rows are dropped mid-call (the batch shrinks inside one call too)
    for n, seed in ((8, 0), (24, 1), (5, 2), (1, 3)):
        ids, mask = _prompts(tokenizer, n, seed)
        want, want_lp = eager.generate(ids, mask, greedy)
        got, got_lp = compiled.generate(ids, mask, greedy)
        if dtype is None:
            assert torch.equal(got, want)
            assert torch.allclose(got_lp, want_lp, atol=1e-4), (got_lp - want_lp).abs().max()
        else:  # rounding differs where inductor keeps fp32 between fused ops: a near tie may
            # pick another token, after which the rows differ; compare up to there
            t = min(got.shape[1], want.shape[1])
            same = (got[:, :t] == want[:, :t]).long().cumprod(dim=1).bool()
            assert same.float().mean() > 0.8, same.float().mean()
            gap = (got_lp[:, :t] - want_lp[:, :t])[same].abs().max()
            assert gap < 0.15, gap
        torch.manual_seed(seed)
        want, want_lp = eager.generate(ids, mask, sampled)
        torch.manual_seed(seed)
        got, got_lp = compiled.generate(ids, mask, sampled)
        if dtype is None:
            assert torch.equal(got, want)
            assert torch.allclose(got_lp, want_lp, atol=1e-4)
    assert compiled.step is not False
    # one graph for every shape seen (dynamic batch, cache length and prompt width), at most
    # one recompile when a dimension first changes
    assert 1 <= frames["unique_graphs"] - before <= 2, dict(frames)


def test_compiled_step_takes_plain_batches_only(model):
    model, tokenizer = model
    decoder = StaticDecoder(model, tokenizer.pad_token_id, tokenizer.eos_token_id, None, True)
    assert plain_plan(decoder._plan(torch.float32))
    snapshot = {k: v + 0.01 for k, v in model.state_dict().items()}
    grouped = decoder._grouped_plan(torch.float32, ["a", "b"], {"b": snapshot},
                                    torch.device("cpu"))
    assert not plain_plan(grouped)
    # a full-weight batch with the compiled step on still runs (eagerly), each row its own
    ids, mask = _prompts(tokenizer, 4, 0)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=6)
    out, _ = decoder.generate(ids, mask, greedy, adapters=["a", "a", "b", "b"],
                              frozen={"b": snapshot})
    alone, _ = decoder.generate(ids[:2], mask[:2], greedy)
    assert torch.equal(out[:2, :alone.shape[1]], alone)


def test_models_of_one_architecture_share_the_compiled_step(model, tmp_path):
    """A league's policies of one architecture compile the decode step once: the second model
    reuses the first one's graphs (the weights are the graph's inputs) and decodes with its
    own weights."""
    from torch._dynamo.utils import counters

    first, tokenizer = model
    other, _ = load_model(build_model(tmp_path / "other", "llama-tiny", seed=1))
    ids, mask = _prompts(tokenizer, 6, 3)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=5)
    args = (tokenizer.pad_token_id, tokenizer.eos_token_id, None)
    StaticDecoder(first, *args, compile=True).generate(ids, mask, greedy)
    before = counters["stats"]["unique_graphs"]
    got, got_lp = StaticDecoder(other.eval(), *args, compile=True).generate(ids, mask, greedy)
    assert counters["stats"]["unique_graphs"] == before, dict(counters["stats"])
    want, want_lp = StaticDecoder(other, *args).generate(ids, mask, greedy)
    assert torch.equal(got, want)
    assert torch.allclose(got_lp, want_lp, atol=1e-4)
    _, mine_lp = StaticDecoder(first, *args).generate(ids, mask, greedy)
    assert (mine_lp - want_lp).abs().max() > 1e-2  # the two models do decode differently
