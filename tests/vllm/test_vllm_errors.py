"""A vLLM engine that cannot start says why in one line, and the HF backend keeps working."""

from __future__ import annotations

import json

import pytest
from vllm_testlib import ENGINE_CFG, make_prompts, policy_config

from agentrt.config.load import validate_config
from agentrt.config.rollout import SamplingConfig
from agentrt.runtime.learner import Learner
from agentrt.core.errors import AgentrtError, ConfigError
from agentrt.runtime.rollout.vllm_backend import RolloutStartError, VLLMRollout
from agentrt.workloads.prompts.config import TrainConfig


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and len(text) < 400, text
    assert isinstance(exc.value, AgentrtError)
    return text


def test_missing_model_folder(tmp_path):
    with pytest.raises(RolloutStartError) as exc:
        VLLMRollout(tmp_path / "nope", ENGINE_CFG)
    text = one_line(exc)
    assert "does not exist" in text and str(tmp_path / "nope") in text


def test_folder_without_config(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(RolloutStartError) as exc:
        VLLMRollout(tmp_path, ENGINE_CFG)
    assert "no config.json" in one_line(exc)


def test_broken_model_folder(tmp_path, tiny_model_dir):
    folder = tmp_path / "broken"
    folder.mkdir()
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg))  # a config but no weights, no tokenizer
    with pytest.raises(RolloutStartError) as exc:
        VLLMRollout(folder, ENGINE_CFG)
    assert "cannot start" in one_line(exc) and str(folder) in str(exc.value)


def test_too_little_kv_cache_then_hf_still_serves(tiny_model_dir):
    tiny = ENGINE_CFG.model_copy(update={"kv_cache_gib": 1e-6})
    with pytest.raises(RolloutStartError) as exc:
        VLLMRollout(tiny_model_dir, tiny)
    text = one_line(exc)
    assert "too little KV-cache memory" in text and "rollout.vllm.kv_cache_gib" in text
    engine = Learner(policy_config(tiny_model_dir), seed=0)  # the HF backend
    comps = engine.generate(make_prompts(4), SamplingConfig(temperature=0.0, max_new_tokens=4))
    assert [len(c.response_ids) for c in comps] == [4, 4, 4, 4]


def test_config_rejects_unknown_backend_and_bad_slots():
    with pytest.raises(ConfigError, match="policy.rollout.backend"):
        validate_config({"policy": {"rollout": {"backend": "tgi"}}}, TrainConfig)
    with pytest.raises(ConfigError, match="max_loras"):
        validate_config({"policy": {"rollout": {"vllm": {"max_loras": 9,
                                                         "max_resident_adapters": 2}}}}, TrainConfig)
    cfg = validate_config({"policy": {"rollout": {"backend": "vllm"}}}, TrainConfig)
    assert cfg.policy.rollout.backend == "vllm"
