"""The one device rule (agentrt/core/device.py) on every path that feeds a module: the HF
fallback rollout, serving, reward models, memory embedders. Each test that takes ``device`` runs
on "cpu" and, where torch sees a GPU, on "cuda" too (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from agentrt.config.rollout import SamplingConfig
from agentrt.core.device import autocast_for, module_device, resolve_device
from agentrt.core.errors import ConfigError
from agentrt.policies.models import build_model, load_model
from agentrt.runtime.rollout.hf import HFRollout

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=6)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory):
    """A non-Llama model (GPT-2): its rollout is transformers' generate, not the static decoder."""
    return build_model(tmp_path_factory.mktemp("dev") / "gpt2-nano", "gpt2-nano", seed=0)


def test_module_device_and_autocast_follow_the_module(device):
    lin = nn.Linear(4, 4).to(device)
    assert module_device(lin).type == device
    assert module_device(nn.ReLU()) == torch.device("cpu")  # no tensors: the CPU
    x = torch.randn(2, 4, device=device)
    with autocast_for(lin, torch.bfloat16):
        assert lin(x).dtype == torch.bfloat16
    with autocast_for(torch.device(device), None):
        assert lin(x).dtype == torch.float32


def test_auto_resolves_as_the_runtime_does():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="^--device is 'cuda' but torch sees no GPU"):
            resolve_device("cuda", "--device")


def _greedy_reference(model: nn.Module, prompt: list[int], steps: int, eos: int
                      ) -> tuple[list[int], list[float]]:
    """Token by token, the whole sequence each step, no cache, no padding."""
    ids, logps = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids], device=module_device(model))).logits[0, -1]
            logp = torch.log_softmax(logits.float(), -1)
            nxt = int(logp.argmax())
            ids.append(nxt)
            logps.append(float(logp[nxt]))
            if nxt == eos:
                break
    return ids[len(prompt):], logps


def test_hf_fallback_rollout_on_the_models_device(gpt2_dir, device):
    model, tok = load_model(gpt2_dir)
    model = model.to(device).eval()
    prompts = [tok.encode("12+3="), tok.encode("7=")]  # two lengths: left padding
    rollout = HFRollout(model, tok, GREEDY, decode="hf")
    out = rollout.generate(prompts)
    for prompt, got in zip(prompts, out):
        want, want_logps = _greedy_reference(model, prompt, GREEDY.max_new_tokens,
                                             tok.eos_token_id)
        assert got.response_ids == want
        assert got.logprobs == pytest.approx(want_logps, abs=1e-4)
    # bf16 autocast on the module's device type (it was always "cpu" before)
    bf16 = HFRollout(model, tok, GREEDY, decode="hf", autocast_dtype=torch.bfloat16)
    for c in bf16.generate(prompts):
        assert 0 < len(c.response_ids) <= GREEDY.max_new_tokens
        assert all(lp <= 0.0 for lp in c.logprobs)


def test_serving_host_places_models_and_adapters_on_the_device(gpt2_dir, device, tmp_path):
    from peft import LoraConfig, get_peft_model

    from agentrt.serving.host import ModelHost
    from agentrt.serving.sources import Source

    base, tok = load_model(gpt2_dir)
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["c_attn"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    host = ModelHost([Source("m", gpt2_dir, None), Source("a", tmp_path / "adapter", gpt2_dir)],
                     device=device)
    try:
        for name in ("m", "a"):
            version = host.acquire(name)
            steps: list[list[int]] = []
            out = version.module.generate([tok.encode("5=")], GREEDY, version.adapter,
                                          steps.append)
            host.release(version)
            assert {p.device.type for p in version.module.model.parameters()} == {device}
            assert [s[0] for s in steps] == out[0].response_ids  # streamed as generated
    finally:
        host.close()


def test_serve_takes_a_run_folders_device(gpt2_dir, tmp_path):
    from agentrt.serving.sources import run_device

    (tmp_path / "config.yaml").write_text("policy:\n  id: p\n  model:\n    device: cpu\n")
    assert run_device(tmp_path) == "cpu"
    assert run_device(gpt2_dir) == "auto"  # a model folder: auto


def test_reward_model_scores_on_its_device(gpt2_dir, device, tmp_path):
    from transformers import AutoTokenizer, GPT2ForSequenceClassification

    from agentrt.rewards.executors import Sample
    from agentrt.rewards.model import ModelExecutor
    from agentrt.rewards.sources import ModelSource

    torch.manual_seed(0)
    clf = GPT2ForSequenceClassification.from_pretrained(gpt2_dir, num_labels=1)
    clf.save_pretrained(tmp_path / "rm")
    AutoTokenizer.from_pretrained(gpt2_dir).save_pretrained(tmp_path / "rm")
    samples = [Sample("s0", "2+2=", "4"), Sample("s1", "1+1=", "3")]
    scored = {}
    for where in {"cpu", device}:
        executor = ModelExecutor(ModelSource(model=str(tmp_path / "rm")), where)
        assert module_device(executor.model).type == where
        scored[where] = executor.score_batch(samples)[0]
    assert scored[device] == pytest.approx(scored["cpu"], abs=1e-4)


def test_embedder_encodes_on_its_device(device):
    from agentrt.memory.embedders import MiniLMEmbedder

    vectors = MiniLMEmbedder(batch_size=2, device=device).encode(["a cat", "a dog", "tax law"])
    assert vectors.shape == (3, 384)
    assert abs(float((vectors ** 2).sum(1).mean()) - 1.0) < 1e-4  # unit rows


def test_async_rollout_guard_resolves_auto():
    """``auto`` is refused where it resolves to CUDA, as the literal ``cuda`` is."""
    from agentrt.config.load import validate_config
    from agentrt.workloads.prompts.config import TrainConfig

    def check(device: str) -> None:
        validate_config({"train": {"async_rollout": {"enabled": True}},
                         "policy": {"model": {"preset": "llama-nano", "device": device}}},
                        TrainConfig)

    check("cpu")
    with pytest.raises(ConfigError, match="policy.model.device cuda runs on CUDA"):
        check("cuda")
    if torch.cuda.is_available():
        with pytest.raises(ConfigError, match="policy.model.device auto runs on CUDA"):
            check("auto")
    else:
        check("auto")


def test_vllm_sleep_setting():
    from agentrt.config.load import validate_config
    from agentrt.runtime.rollout.vllm_backend import RolloutStartError, sleep_mode
    from agentrt.workloads.prompts.config import TrainConfig

    # auto: on only where the platform has sleep mode and a trainer shares the device
    assert sleep_mode("auto", colocated=True, available=True)
    assert not sleep_mode("auto", colocated=False, available=True)  # agentrt serve
    assert not sleep_mode("auto", colocated=True, available=False)  # CPU
    assert sleep_mode(True, colocated=False, available=True)
    assert not sleep_mode(False, colocated=True, available=True)
    with pytest.raises(RolloutStartError, match="^rollout.vllm.sleep is true but"):
        sleep_mode(True, colocated=True, available=False)
    data = {"policy": {"model": {"preset": "llama-nano", "device": "cpu"},
                       "rollout": {"backend": "vllm", "vllm": {"sleep": True}}}}
    with pytest.raises(ConfigError) as err:
        validate_config(data, TrainConfig)
    assert "\n" not in str(err.value) and "policy: rollout.vllm.sleep: true needs a GPU" in \
        str(err.value)
    data["policy"]["rollout"]["vllm"]["sleep"] = "auto"
    assert validate_config(data, TrainConfig).policy.rollout.vllm.sleep == "auto"


def test_vllm_engine_refuses_sleep_true_on_cpu(tiny_model_dir):
    """Without a GPU, an engine asked for sleep mode stops before it starts, naming the field."""
    from vllm.platforms import current_platform

    from agentrt.config.rollout import VLLMConfig
    from agentrt.runtime.rollout.vllm_backend import RolloutStartError, VLLMRollout

    if current_platform.is_sleep_mode_available():
        return  # a GPU platform has sleep mode: nothing to refuse (gpu_check runs it)
    with pytest.raises(RolloutStartError, match="^rollout.vllm.sleep is true but vLLM has no"):
        VLLMRollout(tiny_model_dir, VLLMConfig(sleep=True), colocated=True)


def test_gpu_check_says_no_cuda_device_and_exits_0():
    """`make gpu-check` on a machine without a GPU: one clear line, exit 0; with one, the
    checks' lines (PASS/FAIL/SKIP) and exit 0 only when none failed."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "agentrt.tools.gpu_check", "--only", "serve"],
                          capture_output=True, text=True, timeout=600)
    lines = proc.stdout.splitlines()
    if torch.cuda.is_available():  # serve needs a passing train-grpo: skipped, not failed
        assert proc.returncode == 0 and lines == ["SKIP serve needs a passing train-grpo"]
    else:
        assert proc.returncode == 0 and len(lines) == 1
        assert lines[0].startswith("no CUDA device: ")


def test_gpu_check_configs_validate(tmp_path):
    """Every check's config (an example cut to 2 steps, on the device) passes check-config's
    validation, on CPU and CUDA alike."""
    import yaml

    from agentrt.tools.checks import load_checked
    from agentrt.tools.gpu_check import CHECKS, Settings

    s = Settings("cpu", "bf16", 2, Path("examples"), 0)
    for check in CHECKS:
        if check.example:
            cfg = yaml.safe_load((s.examples / check.example).read_text())
            check.edit(cfg, s)
            cfg["run_dir"] = str(tmp_path / check.name)
            (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
            load_checked(tmp_path / "c.yaml", expect=check.command[0])
