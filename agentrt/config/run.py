"""The base of every run kind's config: the fields a train, tournament and decompose run share.

A kind adds only its own sections (its workload's ``train:`` loop, ``eval:``, policies, envs,
tasks...). Every field here means the same in every kind and is wired the same way by the one
launch (:func:`agentrt.controller.launch.launch`): the run folder, seeding, threads, progress,
checkpoints, the runtime (in-process or Ray), guards, drift, exporters and online control.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from agentrt.config.control import ControlConfig
from agentrt.config.drift import DriftConfig
from agentrt.config.export import ExportConfig
from agentrt.config.sections import (CheckpointConfig, GuardsConfig, PolicyConfig, RuntimeConfig,
                                     Section, check_shared_pools)
from agentrt.core.schema import MAX_SEED


class AsyncRolloutConfig(Section):
    """The next step's rollout overlapping this step's update (docs/async.md)."""

    enabled: bool = Field(False, description="Generate step t+1's samples on a copy of the "
                          "weights while step t's update runs; the PPO ratio corrects the lag.")
    max_staleness: int = Field(1, ge=1, description="Most versions a sample may be behind the "
                               "learner when it is trained; a step with older samples is "
                               "generated again (async/dropped_stale).")


class LoopConfig(Section):
    """The ``train:`` section's shared part: how many steps, and whether the rollout runs ahead."""

    steps: int = Field(100, ge=0, description="Training steps (one rollout + update each).")
    async_rollout: AsyncRolloutConfig = Field(default_factory=AsyncRolloutConfig)


class RunConfig(Section):
    """Fields every run kind has. Subclasses set their own ``run_dir`` default and ``train:``."""

    seed: int = Field(0, ge=0, le=MAX_SEED,
                      description="Global seed for torch, numpy and python (and schedulers).")
    run_dir: str = Field("runs/run", description="Output folder for this run.")
    threads: int | None = Field(None, gt=0, le=1024, description="torch threads (default: "
                                "tuned, see agentrt.runtime.threads).")
    progress: bool = Field(True, description="Show a progress bar on the terminal (a line per "
                           "step when output is redirected).")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    runtime: RuntimeConfig = Field(
        default_factory=RuntimeConfig, description="In-process pools or Ray actors (each "
        "policy's resources: section sizes its pool).")
    guards: GuardsConfig = Field(default_factory=GuardsConfig)
    drift: DriftConfig = Field(default_factory=DriftConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    control: ControlConfig = Field(default_factory=ControlConfig)

    #: Run features this kind does not take (a dotted field that must stay false) and why:
    #: ``check-config`` refuses them before any work, in one line naming the field.
    UNSUPPORTED: ClassVar[dict[str, str]] = {}

    @model_validator(mode="after")
    def _supported(self) -> RunConfig:
        for path, why in self.UNSUPPORTED.items():
            value: object = self
            for part in path.split("."):
                value = getattr(value, part)
            if value:
                raise ValueError(f"{path} is not supported in this kind of run: {why}; set "
                                 f"{path}: false")
        return self

    @model_validator(mode="after")
    def _shared_pools_agree(self) -> RunConfig:
        policies = getattr(self, "policies", None)
        if policies:
            check_shared_pools("policies", list(policies))
        return self

    @model_validator(mode="after")
    def _sharding_needs_ray(self) -> RunConfig:
        if self.runtime.backend == "ray":
            return self
        for name, value in self:
            for i, p in enumerate(value if isinstance(value, list) else [value]):
                if isinstance(p, PolicyConfig) and p.resources.sharding != "none":
                    where = f"{name}.{i}" if isinstance(value, list) else name
                    raise ValueError(f"{where}.resources.sharding: {p.resources.sharding} shards "
                                     "over a pool's Ray workers; set runtime.backend: ray (and "
                                     "resources.num_workers >= 2) or resources.sharding: none")
        return self
