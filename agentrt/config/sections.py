"""The config sections every run kind shares: a policy (model, LoRA, rollout, optimizer,
algorithm, resources, memory), warm-start SFT, evaluation, checkpoints, guards and the runtime.

Every field has a one-line description (shown by ``agentrt config-help``). Unknown keys are
rejected, and so is a NaN or infinite number anywhere (``allow_inf_nan=False``). A bad value
produces one :class:`~agentrt.core.errors.ConfigError` line naming the field and what is allowed
(:mod:`agentrt.config.load`). The run kinds' configs derive from
:class:`agentrt.config.run.RunConfig`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from agentrt.algos.config import AlgorithmConfig
from agentrt.config.rollout import RolloutConfig
from agentrt.core.schema import ConfigModel
from agentrt.memory.augment import MemoryConfig
from agentrt.policies.chat import check_template


class Section(ConfigModel):
    """A section of a run config (see agentrt.core.schema.ConfigModel)."""


class ModelConfig(Section):
    path: str | None = Field(None, description="Local Hugging Face model folder to load.")
    preset: str | None = Field(
        None, description="Build a small local model of this preset instead (see policies.PRESETS)."
    )
    dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="Compute dtype; bf16 uses autocast with fp32 master weights."
    )
    attention: Literal["auto", "sdpa", "matmul"] = Field(
        "auto", description="The attention kernel of the trainer's forward passes: sdpa "
        "(transformers' default), matmul (scores and weighted values as matmuls, softmax in "
        "fp32), or auto: matmul under bf16 on CPU, where SDPA's flash backward is slow, else "
        "sdpa (agentrt/runtime/attention.py). The static decoder's own attention is unaffected.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the trainer and the HF rollout run; auto: CUDA when a GPU is "
        "visible, else CPU.")

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.path is None) == (self.preset is None):
            raise ValueError("set exactly one of model.path (a local HF folder) or model.preset")
        if self.preset is not None:
            from agentrt.policies.presets import PRESETS

            if self.preset not in PRESETS:
                raise ValueError(f"unknown preset {self.preset!r}; valid: {', '.join(PRESETS)}")
        return self

    def device_type(self) -> str:
        """"cpu" or "cuda": ``device`` with auto resolved as the runtime resolves it
        (:func:`agentrt.core.device.resolve_device`; torch is imported for auto only)."""
        if self.device != "auto":
            return self.device
        from agentrt.core.device import resolve_device

        return resolve_device("auto").type


class LoraConfig(Section):
    enabled: bool = Field(False, description="Train a LoRA adapter instead of full weights.")
    r: int = Field(8, gt=0, description="LoRA rank.")
    alpha: int = Field(16, gt=0, description="LoRA scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA path.")
    target_modules: tuple[str, ...] | None = Field(
        None, min_length=1, description="Module names that get adapters; None: every linear "
        "layer of the transformer blocks, whatever the architecture names them (Llama: "
        "q/k/v/o_proj, gate/up/down_proj; GPT-2: c_attn, c_proj, c_fc; Phi-3: qkv_proj, "
        "gate_up_proj...).",
    )


Beta = Annotated[float, Field(ge=0.0, lt=1.0)]  # an AdamW moment decay


class OptimConfig(Section):
    lr: float = Field(1e-4, gt=0.0, le=1.0, description="Peak learning rate of AdamW.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay.")
    betas: tuple[Beta, Beta] = Field((0.9, 0.999), description="AdamW betas, each in [0, 1).")
    eps: float = Field(1e-8, gt=0.0, description="AdamW epsilon.")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="LR schedule after warm-up."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up, in optimizer steps.")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="Floor of linear/cosine decay.")
    max_grad_norm: float | None = Field(1.0, gt=0.0, description="Clip gradients to this norm.")
    fused: bool = Field(True, description="torch's fused AdamW (one kernel over all parameters) "
                        "where the device has it; false: the per-parameter loop, 5-25x slower "
                        "on CPU (docs/performance.md).")


class ResourcesConfig(Section):
    """Ray resources of one policy's pool (used when ``runtime.backend`` is 'ray')."""

    num_workers: int = Field(1, gt=0, description="Data-parallel workers (Ray actors) of the pool.")
    cpus_per_worker: float = Field(1.0, gt=0.0, description="CPUs reserved per worker.")
    gpus_per_worker: float = Field(0.0, ge=0.0, description="GPUs reserved per worker.")
    placement: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Placement group strategy of the pool's workers.")
    custom: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources each worker's bundle asks for "
        "(`ray start --resources`), e.g. {node_1: 0.01} to place the pool (its workers and "
        "their rollout engine) on the nodes that offer node_1.")
    colocate_roles: bool = Field(
        True, description="Actor, reference and critic share each worker process.")
    max_restarts: int = Field(3, ge=0, description="Times Ray restarts a worker that died.")
    sharding: Literal["none", "fsdp"] = Field(
        "none", description="'none': every worker holds the whole model and optimizer state "
        "(replicas, gradients all-reduced); 'fsdp': parameters, gradients and optimizer state "
        "sharded over the workers with torch FSDP2, the rollout taking the full weights once "
        "per update (docs/runtime.md, Sharded training). Needs runtime.backend: ray.")

    @field_validator("custom")
    @classmethod
    def _positive(cls, custom: dict[str, float]) -> dict[str, float]:
        for name, amount in custom.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory") or amount <= 0:
                raise ValueError(f"custom: {name}: {amount} is not a custom resource amount "
                                 "> 0 (CPUs and GPUs are cpus_per_worker / gpus_per_worker)")
        return custom

    @model_validator(mode="after")
    def _colocated(self) -> ResourcesConfig:
        if not self.colocate_roles:
            raise ValueError("colocate_roles: false (reference/critic in their own actors) is not "
                             "supported yet; keep it true (roles share the worker process)")
        return self


class PolicyConfig(Section):
    id: str = Field("policy", min_length=1, description="Name of the policy in metrics and files.")
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(preset="llama-tiny"))
    lora: LoraConfig = Field(default_factory=LoraConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    micro_batch_size: int = Field(64, gt=0, description="Sequences per forward/backward.")
    micro_batch_tokens: int | None = Field(
        None, gt=0, description="Token budget of one forward/backward: rows sorted by length "
        "fill micro-batches of at most this many computed positions (rows x longest row; with "
        "packing, the sum of lengths) and at most micro_batch_size rows, so like lengths are "
        "padded together; a longer row goes alone. None: micro_batch_size rows in batch order. "
        "Either way a micro-batch is cut to its own longest row (docs/architecture.md).")
    packing: bool = Field(
        True, description="Concatenate a micro-batch's sequences into rows of at least 64 "
        "positions, position ids restarting and attention confined to each sequence, so little "
        "padding is computed; log-probs equal the padded ones (docs/architecture.md).")
    share_prefix: bool = Field(
        True, description="With packing: rows that start with the same prompt (a GRPO group's "
        "completions) compute the prompt once, the completions attending to it through a 4D "
        "attention mask; log-probs and gradients equal the unshared ones, fewer positions are "
        "computed (docs/performance.md). Needs packing: true.")
    compile: bool = Field(
        False, description="Run the update's forward + backward through torch.compile "
        "(inductor, dynamic shapes), which fuses the model's element-wise ops: llama-small's "
        "update 1.5x faster on CPU after a one-off compile of about a minute at the first "
        "update (docs/performance.md); and the HF rollout's decode step (the static decoder, "
        "batch and cache length dynamic): bf16 decode 1.2-1.4x faster after a compile of about "
        "half a minute at the first rollout. No-grad log-prob passes stay eager. Full weights "
        "only.")
    trainable: bool = Field(True, description="False freezes the policy (opponents, snapshots).")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    memory: MemoryConfig | None = Field(
        None, description="Memory bank this policy reads into prompts and writes at episode end "
        "(docs/memory.md); None: no memory.")
    template: str = Field(
        "auto", description="Chat template of the policy's prompts: auto (the tokenizer's "
        "chat_template when it has one; the byte-level preset models have none), none (plain "
        "text templates), or a Jinja chat template (its text, or a file holding it) "
        "(docs/envs.md, Chat templates).")
    system: str | None = Field(
        None, description="System message put first in every prompt when a chat template "
        "renders them; None: no system message.")

    @field_validator("template")
    @classmethod
    def _template(cls, value: str) -> str:
        return check_template(value)

    @field_validator("id")
    @classmethod
    def _id_is_a_name(cls, value: str) -> str:
        """An id names folders in the run folder (final_models/<id>, final/<id>, exploiters/...),
        so it must stay one plain name there (issue 41, finding 5)."""
        if (any(c in value for c in "/\\\0:") or value.strip(".") == ""
                or value != value.strip()):
            raise ValueError(f"policy id {value!r} names folders in the run folder; use a plain "
                             "name: no '/', '\\' or ':', no surrounding spaces, not only dots")
        return value

    @model_validator(mode="after")
    def _share_prefix_needs_packing(self) -> PolicyConfig:
        if self.share_prefix and not self.packing and "share_prefix" in self.model_fields_set:
            raise ValueError("share_prefix: sharing a prompt's positions works on packed rows; "
                             "set packing: true or share_prefix: false")
        return self

    @model_validator(mode="after")
    def _compile_full_weights(self) -> PolicyConfig:
        if self.compile and self.lora.enabled:
            raise ValueError("compile: not supported with lora.enabled (LoRA policies switch "
                             "adapters on one shared peft module, untested under torch.compile); "
                             "set compile: false or lora.enabled: false")
        return self

    @model_validator(mode="after")
    def _mixed_reference_full_weights(self) -> PolicyConfig:
        if self.lora.enabled and self.algorithm.kl.rebase_mix < 1.0:
            raise ValueError("algorithm.kl.rebase_mix: a mix of two LoRA adapters' factors is "
                             "not the mix of their weight updates; use rebase_mix: 1 (replace "
                             "the reference) or lora.enabled: false")
        return self

    @model_validator(mode="after")
    def _sharding(self) -> PolicyConfig:
        why = ("rollout.backend is vllm: the sharded trainer feeds the HF rollout only; set "
               "rollout.backend: hf" if self.rollout.backend == "vllm" else
               "compile is true: the sharded update runs eager; set compile: false"
               if self.compile else None)
        if self.resources.sharding == "fsdp" and why is not None:
            raise ValueError(f"resources.sharding: fsdp is not supported where {why}, or "
                             "resources.sharding: none")
        return self

    @model_validator(mode="after")
    def _rollout_logprobs(self) -> PolicyConfig:
        where = ("rollout.backend is vllm" if self.rollout.backend == "vllm" else
                 "model.dtype is bf16" if self.model.dtype == "bf16" else None)
        if self.algorithm.old_logprobs == "rollout" and where is not None:
            raise ValueError(f"algorithm.old_logprobs: rollout takes the PPO ratio's old "
                             f"log-probs from the rollout, whose numerics differ from the "
                             f"trainer's when {where}; use old_logprobs: auto")
        return self

    @model_validator(mode="after")
    def _vllm_sleep_needs_gpu(self) -> PolicyConfig:
        if (self.rollout.backend == "vllm" and self.rollout.vllm.sleep is True
                and self.model.device_type() == "cpu"):
            raise ValueError("rollout.vllm.sleep: true needs a GPU (vLLM has no sleep mode on "
                             "CPU) but the model runs on the CPU; set rollout.vllm.sleep: auto "
                             "(on where a GPU is shared with training) or false")
        return self


def base_key(cfg: PolicyConfig) -> tuple:
    """Policies with equal keys share one pool: LoRA adapters on the same base model, dtype,
    device and rollout backend. Full-weight policies never share."""
    if not cfg.lora.enabled:
        return ("full", cfg.id)
    m = cfg.model
    return ("lora", m.path, m.preset, m.dtype, m.device, cfg.rollout.backend, cfg.lora.r)


#: Settings of a pool, not of each of its adapters: a shared pool takes its first policy's.
POOL_SETTINGS = ("resources", "rollout.batch_size", "rollout.decode", "rollout.vllm")


def check_shared_pools(field: str, policies: list[PolicyConfig]) -> None:
    """LoRA policies that share a pool (:func:`base_key`) agree on :data:`POOL_SETTINGS` (the
    pool would run every one of them with the first's, silently)."""
    first: dict[tuple, int] = {}
    for i, p in enumerate(policies):
        j = first.setdefault(base_key(p), i)
        for path in POOL_SETTINGS if j != i else ():
            mine, theirs = p, policies[j]
            for part in path.split("."):
                mine, theirs = getattr(mine, part), getattr(theirs, part)
            if mine != theirs:
                raise ValueError(
                    f"{field}.{i}.{path} differs from {field}.{j}'s: LoRA policies on one base "
                    f"share one pool, which runs with {field}.{j}'s {path}; give them the same "
                    f"{path} (or another base, dtype or lora.r to give {field}.{i} a pool of "
                    "its own)")


class SFTConfig(Section):
    steps: int = Field(0, ge=0, description="Warm-start SFT steps on task demonstrations; 0 skips.")
    batch_size: int = Field(64, gt=0, description="Demonstrations per SFT step.")
    lr: float = Field(
        1e-3, gt=0.0, le=1.0, description="SFT learning rate (constant after warm-up).")
    warmup_steps: int = Field(10, ge=0, description="SFT linear warm-up steps.")


class EvalConfig(Section):
    every: int = Field(10, gt=0, description="Evaluate every N RL steps (and at start and end).")
    greedy: bool = Field(True, description="Greedy decoding for evaluation.")


class CheckpointConfig(Section):
    every: int = Field(50, gt=0, description="Save every N RL steps (and at the end).")
    keep: int = Field(2, gt=0, description="How many recent checkpoints to keep.")
    models: bool = Field(
        False, description="Also write each learning policy in Hugging Face format (a model "
        "or a LoRA adapter folder) into checkpoints/step_N/models/<id>/: what `agentrt serve "
        "RUN_DIR --follow` serves while the run trains.")


class GuardsConfig(Section):
    """When a run stops (one line, exit code 2) instead of going nowhere (agentrt.controller.guards)."""

    max_reward_error_rate: float = Field(
        0.5, ge=0.0, le=1.0, description="Stop when more than this share of a step's samples "
        "has a failed reward (raised, NaN/inf, beyond ±1e9); 1 never stops.")
    max_skipped_steps: int | None = Field(
        3, gt=0, description="Stop after this many steps in a row whose every update was "
        "skipped for a non-finite loss or gradient; None never stops.")


class RuntimeConfig(Section):
    """Where policies run: in this process, or as pools of Ray actors (docs/runtime.md)."""

    backend: Literal["local", "ray"] = Field(
        "local", description="'local': one engine in this process; 'ray': a pool of Ray actors.")
    address: str | None = Field(
        None, description="Ray cluster to join ('auto', 'ray://head:10001'); None starts Ray here.")
    collective_timeout_s: float = Field(
        300.0, gt=0.0, description="Timeout of one gradient all-reduce between workers.")
    num_cpus: int | None = Field(None, gt=0, description="CPUs of a locally started Ray.")
    keep_freed_memory: bool = Field(
        True, description="Keep memory freed between steps in the process instead of returning "
        "it to the OS (glibc malloc settings, agentrt/runtime/allocator.py): a step's large "
        "tensors are then not page-faulted in again every step; the process keeps its peak "
        "memory.")


