"""policy.compile: the update through torch.compile gives the eager update's loss, gradients and
weights, and a batch of other shapes does not compile again (dynamic shapes)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import LoraConfig, ModelConfig, PolicyConfig
from agentrt.runtime.learner import Learner
from agentrt.policies.models import build_model
from agentrt.core.types import Trajectory, Turn, collate
from test_engine import advantages


def batch_of(engine: Learner, prompts: list[str], group: int):
    tok = engine.tokenizer
    ids = [[tok.bos_token_id] + tok.encode(p) for p in prompts for _ in range(group)]
    trajs = [Trajectory([Turn(p, c.response_ids, c.logprobs, reward=float(i % 3))],
                        group_id=str(i // group))
             for i, (p, c) in enumerate(zip(ids, engine.generate(ids)))]
    return collate(trajs, engine.pad_id)


def test_compiled_update_equals_eager(tmp_path):
    path = build_model(tmp_path / "nano", "llama-nano", seed=0, num_hidden_layers=1)
    engines = [Learner(PolicyConfig(
        model=ModelConfig(path=str(path)), compile=on, optim={"lr": 1e-6},
        rollout={"sampling": SamplingConfig(max_new_tokens=12)}), seed=0) for on in (False, True)]
    eager, compiled = engines
    batches = [batch_of(eager, [f"{a}+{b}=" for a, b in pairs], 4)
               for pairs in ([(1, 2), (13, 40), (7, 77), (50, 5)], [(9, 9), (123, 4)])]
    graphs = torch._dynamo.utils.counters["stats"]  # noqa: SLF001
    for i, batch in enumerate(batches):  # the second batch: other row count and width
        before = graphs["unique_graphs"]
        metrics = []
        for eng in engines:
            b = batch.select(list(range(batch.size)))
            metrics.append(eng.prepare(b) | advantages(eng, b) | eng.update(b))
        assert graphs["unique_graphs"] - before == (1 if i == 0 else 0)  # compiled once
        assert metrics[0]["actor/grad_norm"] > 0
        for key in ("actor/loss", "actor/grad_norm", "actor/entropy"):
            assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-4, abs=1e-6)
        scale = max(float(p.grad.abs().max()) for p in eager.model.parameters())
        for (name, p), q in zip(eager.model.named_parameters(), compiled.model.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=0, atol=1e-4 * scale), name
            assert torch.allclose(p, q, rtol=0, atol=3e-6), name  # AdamW's first step: +-lr
    # the rollout and the no-grad log-probs stay eager over the same (updated) weights
    assert torch.allclose(eager.logprobs(batches[1]), compiled.logprobs(batches[1]), atol=1e-5)


def test_compile_refuses_lora():
    with pytest.raises(ValidationError, match="compile: not supported with lora.enabled"):
        PolicyConfig(model=ModelConfig(preset="llama-nano"), compile=True,
                     lora=LoraConfig(enabled=True))
