"""The config of ``agentrt train``: one policy on a task's prompts or a preference data set."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SerializeAsAny, ValidationError, model_validator

from agentrt.config.run import LoopConfig, RunConfig
from agentrt.config.sections import EvalConfig, PolicyConfig, Section, SFTConfig
from agentrt.core.schema import (MAX_EVAL, MAX_GROUP, MAX_PER_STEP, MAX_SEED, MAX_TASKS,
                                 format_validation_error)
from agentrt.rewards.sources import RewardSource, parse_reward


class TaskConfig(Section):
    name: str = Field("arithmetic", description="Built-in task from agentrt.envs.tasks.TASKS, or a "
                      "prompt source from agentrt.workloads.prompts.data.PROMPT_SOURCES ('dataset': a file).")
    train_size: int = Field(20000, gt=0, le=MAX_TASKS,
                            description="Training prompts generated from the seed.")
    eval_size: int = Field(256, gt=0, le=MAX_EVAL,
                           description="Held-out prompts, disjoint from training.")
    seed: int = Field(1234, ge=0, le=MAX_SEED, description="Seed of the task generator.")
    options: dict[str, Any] = Field(default_factory=dict, description="Task-specific options.")

    @model_validator(mode="after")
    def _known_task(self) -> TaskConfig:
        from agentrt.envs.tasks import TASKS
        from agentrt.workloads.prompts.data import PROMPT_SOURCES, options_model

        model = options_model(self.name)
        if self.name not in TASKS and model is None:
            raise ValueError(f"unknown task {self.name!r}; valid: "
                             f"{', '.join(TASKS.names() + PROMPT_SOURCES.names())}")
        try:
            (model or TASKS.get(self.name).options_model)(**self.options)
        except ValidationError as exc:
            raise ValueError(f"options: {format_validation_error(exc)}") from None
        return self


class PromptLoopConfig(LoopConfig):
    steps: int = Field(100, ge=0, description="RL steps (one rollout + update each).")
    prompts_per_step: int = Field(32, gt=0, le=MAX_PER_STEP,
                                  description="Distinct prompts per step.")
    group_size: int = Field(8, gt=0, le=MAX_GROUP, description="Responses sampled per prompt.")

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

class TrainConfig(RunConfig):
    """Config of ``agentrt train``: one policy, one task."""

    run_dir: str = Field("runs/train", description="Output folder for this run.")
    task: TaskConfig = Field(default_factory=TaskConfig)
    reward: Annotated[str | list[SerializeAsAny[RewardSource]], BeforeValidator(parse_reward)] = \
        Field("exact_match", description="Reward name in agentrt.rewards or 'module:function'; "
              "or a source ({python: ..}, {http: URL}, {model: FOLDER}) or a list of sources "
              "with weights (docs/rewards.md).")
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    train: PromptLoopConfig = Field(default_factory=PromptLoopConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    data: DataConfig = Field(default_factory=DataConfig)

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
        elif p.model.device_type() == "cuda":  # auto too, where it resolves to a GPU
            why = (f"it is built and tested on CPU only (policy.model.device {p.model.device} "
                   "runs on CUDA here): set policy.model.device: cpu")
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
