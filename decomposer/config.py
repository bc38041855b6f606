"""Config of ``agentrt decompose run``: a task family, a planner, specialist policies, a router.

Example (examples/decompose_wordchain.yaml)::

    family: {name: wordchain}
    planner: {kind: lm, policy: planner}
    policies:
      - {id: planner, model: {preset: llama-tiny}}
      - {id: reader, model: {preset: llama-tiny}, skills: [parse, format]}
      - {id: calc, model: {preset: llama-tiny}, skills: [add, sub, mul, div]}
    router: {exploration: ucb}
    train: {steps: 40, tasks_per_step: 32, group_size: 4}

Every subtask type the planner may use needs at least one policy (or tool) with its skill; a
policy or tool with skills is a specialist, the planner policy has none. ``planner.kind: single``
is the generalist baseline: the whole task is one ``solve`` step.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from agentrt.decomposer.router import RouterConfig
from agentrt.decomposer.sdk import WHOLE, make_family
from pydantic import Field, field_validator, model_validator

from agentrt.config.run import LoopConfig, RunConfig
from agentrt.config.sections import PolicyConfig, Section, SFTConfig
from agentrt.core.schema import MAX_EVAL, MAX_GROUP, MAX_PER_STEP, MAX_SEED, MAX_TASKS


class FamilyConfig(Section):
    name: str = Field("wordchain", description="Task family from agentrt.decomposer.FAMILIES.")
    options: dict[str, Any] = Field(default_factory=dict, description="Family options.")
    train_size: int = Field(4000, gt=0, le=MAX_TASKS,
                            description="Training tasks generated from the seed.")
    eval_size: int = Field(200, gt=0, le=MAX_EVAL,
                           description="Held-out tasks, disjoint from training.")
    seed: int = Field(1234, ge=0, le=MAX_SEED, description="Seed of the task generator.")


class PlannerConfig(Section):
    kind: Literal["rule", "lm", "single"] = Field(
        "rule", description="rule: the family's template planner; lm: a trained planner policy; "
                            "single: the whole task as one 'solve' step (a generalist).")
    policy: str | None = Field(None, description="Id of the planner policy (kind: lm).")
    max_subtasks: int = Field(6, gt=0, description="Steps a plan may have.")
    token_budget: int | None = Field(
        None, gt=0, description="Token budget of a plan's steps together (None: no limit).")


class ChainConfig(Section):
    on_failure: Literal["end", "repair", "continue"] = Field(
        "end", description="After a failed subtask: end the chain, retry the step, or go on.")
    repairs: int = Field(1, ge=0, description="Retries of one step (on_failure: repair).")
    retry_with: Literal["other", "any"] = Field(
        "other", description="Who retries a failed step: 'other' a specialist that has not failed "
                             "it yet when one has the skill, 'any' whoever the router picks.")
    outcome_share: float = Field(
        0.5, ge=0.0, le=1.0, description="Share of the task outcome each specialist gets on top "
                                         "of its subtask verifier's reward.")


class SpecialistPolicy(PolicyConfig):
    skills: tuple[str, ...] = Field(
        (), description="Subtask types (or tags) this policy is routed; empty for the planner.")
    sft_steps: int | None = Field(
        None, ge=0, description="Warm-start SFT steps of this policy (None: sft.steps).")
    sft_match: str | None = Field(
        None, description="Warm-start only on the rows of its subtask types whose observation "
                          "matches this regular expression (re.search), e.g. specialists for "
                          "different slices of the work; None: every row of its types.")

    @field_validator("sft_match")
    @classmethod
    def _regex(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"not a regular expression ({e}): {pattern!r}") from None
        return pattern

    @field_validator("memory")
    @classmethod
    def _no_memory(cls, memory: Any) -> Any:
        if memory is not None:  # refused, not ignored: a config must do what it says
            raise ValueError("a decomposer specialist has no memory bank yet (its observation "
                             "would not change); remove memory:. The router remembers past "
                             "outcomes per subtask: router.memory: true")
        return memory


class ToolConfig(Section):
    id: str = Field(..., min_length=1, description="Name of the tool in routing and metrics.")
    fn: str = Field(..., description="'module:function' taking an ActRequest, returning text.")
    skills: tuple[str, ...] = Field(..., min_length=1, description="Subtask types it is routed.")


class DecomposeLoopConfig(LoopConfig):
    steps: int = Field(40, ge=0, description="RL steps (one batch of chains + updates each).")
    tasks_per_step: int = Field(32, gt=0, le=MAX_PER_STEP, description="Distinct tasks per step.")
    group_size: int = Field(4, gt=0, le=MAX_GROUP,
                            description="Chains played per task (planner baselines).")


class DecomposeEvalConfig(Section):
    every: int = Field(10, gt=0, description="Evaluate every N steps (and at start and end).")
    size: int | None = Field(None, gt=0, description="Held-out tasks evaluated (None: all).")
    greedy: bool = Field(True, description="Greedy decoding for evaluation (routing is "
                                           "always the router's best pick).")
    examples: int = Field(8, ge=0, description="Example chains kept per evaluation (report).")


class DecomposeConfig(RunConfig):
    """``agentrt decompose run CONFIG.yaml``."""

    UNSUPPORTED = {
        "train.async_rollout.enabled": "the run's one router would bind the next step's "
        "subtasks in the rollout thread while this step's evaluation routes with it too",
    }

    run_dir: str = Field("runs/decompose", description="Output folder for this run.")
    family: FamilyConfig = Field(default_factory=FamilyConfig)
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    policies: list[SpecialistPolicy] = Field(..., min_length=1, description="LM policies.")
    tools: list[ToolConfig] = Field(default_factory=list, description="Python specialists.")
    router: RouterConfig = Field(default_factory=RouterConfig,
                                 description="Which specialist runs each subtask.")
    chain: ChainConfig = Field(default_factory=ChainConfig,
                               description="What a chain does when a step fails.")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="Warm start of the planner "
                           "and specialists on demonstrations (sft_steps per policy overrides).")
    train: DecomposeLoopConfig = Field(default_factory=DecomposeLoopConfig)
    eval: DecomposeEvalConfig = Field(default_factory=DecomposeEvalConfig)

    @model_validator(mode="after")
    def _consistent(self) -> DecomposeConfig:
        ids = [p.id for p in self.policies] + [t.id for t in self.tools]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"policy and tool ids must be unique; {dup[0]!r} is used twice")
        if any("@" in i or i == "*" for i in ids):
            raise ValueError("policy and tool ids may not contain '@' or be '*'")
        try:
            family = make_family(self.family.name, self.family.options)
        except KeyError as e:
            raise ValueError(f"family.name: {e.args[0]}") from None
        p = self.planner
        if p.kind == "lm":
            if p.policy not in [q.id for q in self.policies]:
                raise ValueError(f"planner.policy must name one of the policies for kind: lm; "
                                 f"got {p.policy!r}")
        elif p.policy is not None:
            raise ValueError(f"planner.policy is only for kind: lm (kind is {p.kind!r})")
        needed = [WHOLE] if p.kind == "single" else [t for t in family.types if t != WHOLE]
        have = {s for q in [*self.policies, *self.tools] for s in q.skills}
        for kind in needed:
            if not set(family.types[kind].skills) & have:
                raise ValueError(f"no policy or tool has a skill for subtask type {kind!r} "
                                 f"(skills it accepts: {', '.join(family.types[kind].skills)}); "
                                 f"add it to a policy's or tool's skills")
        known = {s for t in family.types.values() for s in t.skills}
        for q in [*self.policies, *self.tools]:
            bad = sorted(set(q.skills) - known)
            if bad:
                raise ValueError(f"{q.id}.skills: unknown skill {bad[0]!r}; family "
                                 f"{self.family.name!r} has {', '.join(sorted(known))}")
        if p.kind == "lm" and [q for q in self.policies if q.id == p.policy][0].skills:
            raise ValueError(f"the planner policy {p.policy!r} must have no skills")
        return self

    def specialists(self) -> dict[str, tuple[str, ...]]:
        """Policy or tool id -> skills, for every specialist."""
        return {q.id: tuple(q.skills) for q in [*self.policies, *self.tools] if q.skills}
