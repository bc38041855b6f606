"""`rollout.backend: vllm` in a policy config: the engine rolls out with vLLM and syncs itself."""

from __future__ import annotations

from vllm_testlib import grpo_step, make_prompts, policy_config

from agentrt.config.rollout import RolloutConfig, SamplingConfig
from agentrt.runtime.learner import Learner
from agentrt.runtime.rollout.hf import HFRollout


def test_engine_with_vllm_backend_syncs_after_every_update(tiny_model_dir):
    cfg = policy_config(tiny_model_dir, temperature=1.0, lr=1e-2, max_new_tokens=8)
    cfg = cfg.model_copy(update={"rollout": RolloutConfig(
        backend="vllm", sampling=cfg.rollout.sampling, vllm=cfg.rollout.vllm)})
    engine = Learner(cfg, seed=0)
    try:
        assert type(engine.shared.vllm).__name__ == "VLLMRollout"
        hf = HFRollout(engine.model, engine.tokenizer, cfg.rollout.sampling)
        prompts = make_prompts(16, seed=3)
        greedy = SamplingConfig(temperature=0.0, max_new_tokens=8)
        before = [c.response_ids for c in engine.generate(prompts, greedy)]
        for _ in range(2):
            group = prompts[:4] * 4
            metrics = grpo_step(engine, engine.generate(group), group, group=4)
            assert metrics["timing_s/sync"] > 0  # the update pushed weights into vLLM itself
        after = [c.response_ids for c in engine.generate(prompts, greedy)]
        assert after == [c.response_ids for c in hf.generate(prompts, greedy)]
        assert after != before  # training changed the policy, and vLLM serves the new weights
    finally:
        engine.shared.close()
