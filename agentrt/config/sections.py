"""Run configuration: frozen pydantic models loaded from YAML and validated before any work.

Every field has a one-line description (shown by ``agentrt config-help``). Unknown keys are
rejected, and so is a NaN or infinite number anywhere (``allow_inf_nan=False``). A bad value
produces one :class:`ConfigError` line naming the field and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (BeforeValidator, Field, SerializeAsAny, ValidationError, field_serializer,
                      model_validator)

from agentrt.algos.config import ALGORITHM_PRESETS, AlgorithmConfig, KLConfig  # noqa: F401
from agentrt.controller.control import ControlConfig
from agentrt.controller.drift import DriftConfig
from agentrt.core.errors import ConfigError
from agentrt.controller.exporters import ExportConfig, MLflowConfig, PrometheusConfig  # noqa: F401
from agentrt.memory.augment import MemoryConfig
from agentrt.rewards.sources import RewardSource, parse_reward
from agentrt.config.rollout import RolloutConfig, SamplingConfig, VLLMConfig  # noqa: F401
from agentrt.core.schema import ConfigModel


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


class LoraConfig(Section):
    enabled: bool = Field(False, description="Train a LoRA adapter instead of full weights.")
    r: int = Field(8, gt=0, description="LoRA rank.")
    alpha: int = Field(16, gt=0, description="LoRA scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA path.")
    target_modules: tuple[str, ...] = Field(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        description="Module names that get adapters.",
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
    colocate_roles: bool = Field(
        True, description="Actor, reference and critic share each worker process.")
    max_restarts: int = Field(3, ge=0, description="Times Ray restarts a worker that died.")

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
    def _rollout_logprobs(self) -> PolicyConfig:
        where = ("rollout.backend is vllm" if self.rollout.backend == "vllm" else
                 "model.dtype is bf16" if self.model.dtype == "bf16" else None)
        if self.algorithm.old_logprobs == "rollout" and where is not None:
            raise ValueError(f"algorithm.old_logprobs: rollout takes the PPO ratio's old "
                             f"log-probs from the rollout, whose numerics differ from the "
                             f"trainer's when {where}; use old_logprobs: auto")
        return self


class TaskConfig(Section):
    name: str = Field("arithmetic", description="Built-in task from agentrt.envs.tasks.TASKS, or a "
                      "prompt source from agentrt.workloads.prompts.data.PROMPT_SOURCES ('dataset': a file).")
    train_size: int = Field(20000, gt=0, description="Training prompts generated from the seed.")
    eval_size: int = Field(256, gt=0, description="Held-out prompts, disjoint from training.")
    seed: int = Field(1234, description="Seed of the task generator.")
    options: dict[str, Any] = Field(default_factory=dict, description="Task-specific options.")

    @model_validator(mode="after")
    def _known_task(self) -> TaskConfig:
        from agentrt.workloads.prompts.data import PROMPT_SOURCES, options_model
        from agentrt.envs.tasks import TASKS

        model = options_model(self.name)
        if self.name not in TASKS and model is None:
            raise ValueError(f"unknown task {self.name!r}; valid: "
                             f"{', '.join(TASKS.names() + PROMPT_SOURCES.names())}")
        try:
            (model or TASKS.get(self.name).options_model)(**self.options)
        except ValidationError as exc:
            raise ValueError(f"options: {format_validation_error(exc)}") from None
        return self


class SFTConfig(Section):
    steps: int = Field(0, ge=0, description="Warm-start SFT steps on task demonstrations; 0 skips.")
    batch_size: int = Field(64, gt=0, description="Demonstrations per SFT step.")
    lr: float = Field(
        1e-3, gt=0.0, le=1.0, description="SFT learning rate (constant after warm-up).")
    warmup_steps: int = Field(10, ge=0, description="SFT linear warm-up steps.")


class AsyncRolloutConfig(Section):
    """The next step's rollout overlapping this step's update (docs/async.md)."""

    enabled: bool = Field(False, description="Generate step t+1's samples on a copy of the "
                          "weights while step t's update runs; the PPO ratio corrects the lag.")
    max_staleness: int = Field(1, ge=1, description="Most versions a sample may be behind the "
                               "learner when it is trained; a step with older samples is "
                               "generated again (async/dropped_stale).")


class LoopConfig(Section):
    steps: int = Field(100, ge=0, description="RL steps (one rollout + update each).")
    prompts_per_step: int = Field(32, gt=0, description="Distinct prompts per step.")
    group_size: int = Field(8, gt=0, description="Responses sampled per prompt.")
    async_rollout: AsyncRolloutConfig = Field(default_factory=AsyncRolloutConfig)


class EvalConfig(Section):
    every: int = Field(10, gt=0, description="Evaluate every N RL steps (and at start and end).")
    greedy: bool = Field(True, description="Greedy decoding for evaluation.")


class CheckpointConfig(Section):
    every: int = Field(50, gt=0, description="Save every N RL steps (and at the end).")
    keep: int = Field(2, gt=0, description="How many recent checkpoints to keep.")


class GuardsConfig(Section):
    """When a run stops (one line, exit code 2) instead of going nowhere (agentrt.controller.guards)."""

    max_reward_error_rate: float = Field(
        0.5, ge=0.0, le=1.0, description="Stop when more than this share of a step's samples "
        "has a failed reward (raised, NaN/inf, beyond ±1e9); 1 never stops.")
    max_skipped_steps: int | None = Field(
        3, gt=0, description="Stop after this many steps in a row whose every update was "
        "skipped for a non-finite loss or gradient; None never stops.")


class DataConfig(Section):
    """Preference data set of ``algorithm: dpo | ipo | kto | listwise`` (docs/preference.md)."""

    path: str | None = Field(
        None, description="A .jsonl or .parquet file, or a datasets folder (save_to_disk).")
    format: Literal["auto", "jsonl", "parquet", "datasets"] = Field(
        "auto", description="File format; auto picks by suffix (a folder is a datasets folder).")
    split: str | None = Field(
        None, description="Split of a saved DatasetDict (default: 'train' when present).")
    max_length: int = Field(
        512, gt=0, description="Longest prompt + response in tokens; longer rows are skipped.")
    eval_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Share of prompts held out for eval/pref_accuracy.")
    pairs: Literal["all", "best_worst"] = Field(
        "all", description="Pairs of a ranked list: every ordered pair, or best vs worst.")

    @model_validator(mode="after")
    def _exists(self) -> DataConfig:
        if self.path is not None and not Path(self.path).exists():
            raise ValueError(f"data.path {self.path!r} does not exist")
        return self


class RuntimeConfig(Section):
    """Where policies run: in this process, or as pools of Ray actors (docs/runtime.md)."""

    backend: Literal["local", "ray"] = Field(
        "local", description="'local': one engine in this process; 'ray': a pool of Ray actors.")
    address: str | None = Field(
        None, description="Ray cluster to join ('auto', 'ray://head:10001'); None starts Ray here.")
    num_cpus: int | None = Field(None, gt=0, description="CPUs of a locally started Ray.")
    collective_timeout_s: float = Field(
        300.0, gt=0.0, description="Timeout of one gradient all-reduce between workers.")
    keep_freed_memory: bool = Field(
        True, description="Keep memory freed between steps in the process instead of returning "
        "it to the OS (glibc malloc settings, agentrt/runtime/allocator.py): a step's large tensors are "
        "then not page-faulted in again every step; the process keeps its peak memory.")


class TrainConfig(Section):
    """Config of ``agentrt train``: one policy, one task."""

    seed: int = Field(0, description="Global seed for torch, numpy and python.")
    run_dir: str = Field("runs/train", description="Output folder for this run.")
    threads: int | None = Field(None, gt=0, description="torch threads (default: tuned, see "
                                "agentrt.runtime.threads).")
    task: TaskConfig = Field(default_factory=TaskConfig)
    reward: Annotated[str | list[SerializeAsAny[RewardSource]], BeforeValidator(parse_reward)] = \
        Field("exact_match", description="Reward name in agentrt.rewards or 'module:function'; "
              "or a source ({python: ..}, {http: URL}, {model: FOLDER}) or a list of sources "
              "with weights (docs/rewards.md).")
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    train: LoopConfig = Field(default_factory=LoopConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    progress: bool = Field(True, description="Show a progress bar on the terminal.")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    guards: GuardsConfig = Field(default_factory=GuardsConfig)
    drift: DriftConfig = Field(default_factory=DriftConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    control: ControlConfig = Field(default_factory=ControlConfig)

    @model_validator(mode="after")
    def _no_memory(self) -> TrainConfig:
        if self.policy.memory is not None:
            raise ValueError("policy.memory needs episodes to remember; the single-task trainer "
                             "has none: use it in a tournament run (agentrt tournament run)")
        return self

    @model_validator(mode="after")
    def _preference_source(self) -> TrainConfig:
        algo = self.policy.algorithm
        if algo.is_preference and not algo.online and self.data.path is None:
            raise ValueError(f"algorithm {algo.name} needs data.path (a JSONL/Parquet/datasets "
                             "folder) or policy.algorithm.online: true")
        return self

    @model_validator(mode="after")
    def _async_rollout(self) -> TrainConfig:
        if not self.train.async_rollout.enabled:
            return self
        p, why = self.policy, None
        if p.algorithm.is_preference:
            why = (f"it corrects the lag with the PPO importance ratio, which algorithm "
                   f"{p.algorithm.name} does not have")
        elif self.runtime.backend != "local":
            why = ("its rollout process shares the weights' memory with this one: set "
                   "runtime.backend: local")
        elif p.rollout.backend != "hf":
            why = "it generates on a copy of the module: set policy.rollout.backend: hf"
        elif p.model.device == "cuda":
            why = "it is built and tested on CPU only: set policy.model.device: cpu"
        elif p.algorithm.old_logprobs == "recompute":
            why = ("the PPO ratio of a stale sample needs its rollout (behaviour) log-probs: set "
                   "policy.algorithm.old_logprobs: auto")
        elif self.drift.enabled and self.drift.action != "log":
            why = (f"drift.action {self.drift.action} reloads a checkpoint under a step in "
                   "flight: set drift.action: log")
        if why is not None:
            raise ValueError(f"train.async_rollout is not supported here: {why}, or "
                             "train.async_rollout.enabled: false")
        return self


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """One line per problem: 'policy.optim.lr: Input should be greater than 0 (got -1)'.

    ``prefix`` goes before each location (a list item validated on its own: 'reward.0.')."""
    lines = []
    for e in err.errors():
        loc = prefix + ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        shown = "" if isinstance(got, dict) or e["type"] == "missing" else f" (got {got!r})"
        if loc and msg.startswith(f"{loc}."):  # the message names a place inside the field
            loc, shown = "", ""
        # A check across fields (no location) names its fields in its own message.
        lines.append(f"{loc}: {msg}{shown}" if loc else f"{msg}{shown}")
    return "; ".join(lines)


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """['policy.optim.lr=1e-3', 'train.steps=5'] -> nested dict (values parsed as YAML).

    A number picks an element of a list section: ``policies.0.optim.lr=3e-4``."""
    out: dict[str, Any] = {}
    for item in overrides:
        key, eq, raw = item.partition("=")
        parts = key.strip().split(".")
        if not eq or not all(parts):
            raise ConfigError(f"override {item!r} must look like section.field=value")
        node = out
        for depth, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parts[:depth + 1])} is set to "
                                  "a value by another --set; give one of the two")
        node[parts[-1]] = _yaml(raw, f"override {item!r}")
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        elif isinstance(value, dict) and isinstance(merged.get(key), list):
            merged[key] = _merge_list(key, merged[key], value)
        else:
            merged[key] = value
    return merged


def _merge_list(name: str, base: list[Any], extra: dict[str, Any]) -> list[Any]:
    items = list(base)
    for index, value in extra.items():
        if not str(index).isdecimal() or int(index) >= len(items):
            raise ConfigError(f"override {name}.{index}: {name} is a list of {len(items)}; use "
                              f"an index 0-{len(items) - 1}")
        old = items[int(index)]
        items[int(index)] = (_merge(old, value) if isinstance(old, dict) and isinstance(value, dict)
                             else value)
    return items


def load_config(
    path: str | Path, overrides: list[str] | None = None, model: type[Section] = TrainConfig
) -> Any:
    """Reads YAML, applies ``a.b=c`` overrides and validates. Raises ConfigError on any problem."""
    return validate_config(read_config(path, overrides), model)


def read_config(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """The YAML mapping at ``path`` with ``a.b=c`` overrides merged in (not validated yet)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not a config file; give a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a UTF-8 text file; give a YAML config") from None
    data = _yaml(text, str(path))
    if data is None:
        raise ConfigError(f"{path} is empty; write the config's sections in it (see examples/)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return _merge(data, parse_overrides(overrides or []))


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error (YAML says keys are
    unique; PyYAML lets the last one win, silently dropping the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *anchor' may override keys
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                continue  # an unhashable key: the safe loader's own error follows
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (also at line {seen[key]}); keep one",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _yaml(text: str, where: str) -> Any:
    """``text`` parsed as YAML by the strict loader; ConfigError naming ``where`` and the line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML{at}: {problem}") from None


def validate_config(data: dict[str, Any], model: type[Section] = TrainConfig) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {format_validation_error(exc)}") from None


def dump_config(cfg: Section) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
