"""The decomposer SDK: subtask types and task families, defined in Python like envs and rewards.

A *task family* generates long tasks from seeds (with a disjoint held-out split), knows how a rule
planner splits a task into subtasks, and verifies a whole task's answer. A *subtask type* is what
a specialist policy does: a goal, an observation builder (the task's text plus the outputs of the
steps it reads), a verifier, a reference answer for SFT demonstrations and a token budget.

A task's ``data`` holds the facts its verifiers check (the answer among them). Planners and
observation builders read only ``task.text`` and earlier outputs, as a generalist reads only the
text: they get the task with its data sealed (:func:`visible`), and a read is a
:class:`HiddenFieldError`. Verifiers and references read ``task.data``::

    from agentrt.decomposer import FAMILIES, SubtaskType, TaskFamily, Task, Verdict, Plan

    double = SubtaskType(
        "double", goal="double the number",
        observe=lambda ctx: f"double {ctx.task.text.split()[-1].rstrip('?')}",
        verify=lambda ctx, out: out.strip() == str(2 * ctx.task.data["x"]),
        reference=lambda ctx: str(2 * ctx.task.data["x"]),
        max_tokens=4)

    @FAMILIES.register("doubling")
    class Doubling(TaskFamily):
        subtask_types = (double,)

        def make_task(self, rng, index):
            x = rng.randint(0, 99)
            return Task(f"doubling/{index}", f"what is twice {x}?", {"x": x})

        def rule_plan(self, task):
            return Plan.chain(["double"])

        def verify(self, task, answer):
            return Verdict(answer.strip() == str(2 * task.data["x"]), "wrong number")

Verifiers return a :class:`Verdict`, a bool or a score in [0, 1]; one that raises is recorded as
a failed subtask with the exception as its reason.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from pydantic import BaseModel

from agentrt.core.errors import AgentrtError
from agentrt.decomposer.plan import Plan, Step
from agentrt.core.registry import Registry
from agentrt.core.schema import ConfigModel


@dataclass(frozen=True)
class Verdict:
    """A verifier's judgement: ``ok``, a reason when not, and an optional score in [0, 1]."""

    ok: bool
    reason: str = ""
    score: float | None = None

    @property
    def reward(self) -> float:
        return float(self.score) if self.score is not None else float(self.ok)


def as_verdict(value: Verdict | bool | float) -> Verdict:
    """Normalizes what a verifier returned (a score counts as ok at 1.0)."""
    if isinstance(value, Verdict):
        return value
    if isinstance(value, bool):
        return Verdict(value, "" if value else "rejected by the verifier")
    if isinstance(value, (int, float)):
        score = min(1.0, max(0.0, float(value)))
        return Verdict(score >= 1.0, "" if score >= 1.0 else f"score {score:.2f}", score)
    raise TypeError(f"a verifier must return a Verdict, bool or float, not {type(value).__name__}")


@dataclass(frozen=True)
class Task:
    """One long task: a stable id, its text (what a planner or a generalist reads) and the
    structured facts its verifiers check."""

    id: str
    text: str
    data: Mapping[str, Any] = field(default_factory=dict)


class HiddenFieldError(AgentrtError):
    """A planner or an observation builder read ``task.data``: only verifiers and references
    may (a generalist reads nothing but the task's text, so a decomposer must not either)."""


class _Sealed(Mapping[str, Any]):
    """``task.data`` as planners and observation builders get it: every read is an error."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id

    def _refuse(self, what: str) -> HiddenFieldError:
        return HiddenFieldError(
            f"task {self.task_id}: {what} of the task's hidden data was read by a planner or an "
            "observation builder; they may read only task.text and earlier steps' outputs "
            "(ctx.inputs, ctx.output_of); verifiers and references read task.data")

    def __getitem__(self, key: str) -> Any:
        raise self._refuse(f"field {key!r}")

    def __iter__(self) -> Iterator[str]:
        raise self._refuse("the fields")

    def __len__(self) -> int:
        raise self._refuse("the size")


def visible(task: Task) -> Task:
    """What a planner, the router and a specialist's observation may read of ``task``: its id
    and text, its data sealed (:class:`HiddenFieldError` on any read)."""
    return task if isinstance(task.data, _Sealed) else Task(task.id, task.text, _Sealed(task.id))


@dataclass
class StepContext:
    """What a subtask's observation builder and verifier see."""

    task: Task
    step: Step
    plan: Plan
    outputs: dict[int, str]

    @property
    def inputs(self) -> list[str]:
        """Outputs of the steps this one reads, in the order the plan names them."""
        return [self.outputs.get(d, "") for d in self.step.deps]

    def index(self, of_type: str | None = None) -> int:
        """How many steps (of ``of_type``, or of any type) come before this one in the plan."""
        before = self.plan.steps[:[s.id for s in self.plan.steps].index(self.step.id)]
        return sum(of_type is None or s.type == of_type for s in before)

    def output_of(self, of_type: str) -> str | None:
        """Output of the latest finished step of type ``of_type`` (None if there is none)."""
        found = None
        for s in self.plan.steps:
            if s.type == of_type and s.id in self.outputs:
                found = self.outputs[s.id]
        return found


@dataclass(frozen=True)
class SubtaskType:
    """What a specialist does.

    Attributes:
        name: The type's name, as plans write it.
        goal: One line saying what the output must be (shown in docs and reports).
        observe: ``ctx -> text``: the observation of this step (task + outputs it reads).
        verify: ``(ctx, output) -> Verdict | bool | float``: the subtask's own verifier.
        reference: ``ctx -> text``: the right output, for SFT demonstrations (optional).
        max_tokens: Token budget of the step's output.
        tags: Skills a policy needs to be routed this type (default: the type's name).
    """

    name: str
    goal: str
    observe: Callable[[StepContext], str]
    verify: Callable[[StepContext, str], Verdict | bool | float]
    reference: Callable[[StepContext], str] | None = None
    max_tokens: int = 16
    tags: tuple[str, ...] = ()

    @property
    def skills(self) -> tuple[str, ...]:
        return self.tags or (self.name,)


WHOLE = "solve"  # the subtask type of a whole task done in one step (what a generalist does)


class FamilyOptions(ConfigModel):
    """Options of a family without any."""


class TaskFamily:
    """Base of task families (see the module docstring). Subclasses set ``subtask_types`` and
    implement ``make_task``, ``rule_plan`` and ``verify``; ``options_model`` validates options.
    """

    subtask_types: tuple[SubtaskType, ...] = ()
    options_model: type[BaseModel] = FamilyOptions
    whole_tokens = 32  # token budget of the whole task in one step

    def __init__(self, **options: Any) -> None:
        self.options = self.options_model(**options)
        names = [t.name for t in self.subtask_types]
        if len(set(names)) != len(names) or WHOLE in names:
            raise ValueError(f"subtask type names must be unique and not {WHOLE!r}: {names}")
        self.types: dict[str, SubtaskType] = {t.name: t for t in self.subtask_types}
        self.types[WHOLE] = SubtaskType(
            WHOLE, "the whole task in one answer", observe=lambda ctx: self.whole_prompt(ctx.task),
            verify=lambda ctx, out: self.verify(ctx.task, out),
            reference=lambda ctx: self.answer_of(ctx.task), max_tokens=self.whole_tokens)

    # ------------------------------------------------------------------ to implement
    def make_task(self, rng: random.Random, index: int) -> Task:
        """A task drawn with ``rng`` (``index`` only names it)."""
        raise NotImplementedError

    def rule_plan(self, task: Task) -> Plan:
        """The rule planner's plan of ``task``, from its text (its data is sealed: see
        :func:`visible`)."""
        raise NotImplementedError

    def verify(self, task: Task, answer: str) -> Verdict | bool | float:
        """Judges a whole task's answer (the one :meth:`answer` assembles, or a generalist's)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ defaults
    def answer(self, task: Task, plan: Plan, outputs: dict[int, str]) -> str:
        """The task's answer assembled from a finished chain: by default the last step's output."""
        return outputs.get(plan.steps[-1].id, "") if plan.steps else ""

    def whole_prompt(self, task: Task) -> str:
        """What a generalist reads to do the whole task in one answer (the text only)."""
        return f"solve: {task.text}\n"

    def planner_prompt(self, task: Task) -> str:
        """What the LM planner reads; it answers with a plan (see :mod:`.plan`)."""
        return f"plan: {task.text}\n"

    def answer_of(self, task: Task) -> str:
        """The reference answer of the whole task: the rule plan run on reference outputs."""
        plan = self.rule_plan(visible(task))
        return self.answer(task, plan, self.reference_outputs(task, plan))

    def reference_outputs(self, task: Task, plan: Plan) -> dict[int, str]:
        """Each step's reference output along ``plan`` (types without a reference give '')."""
        outputs: dict[int, str] = {}
        for step in plan.steps:
            ref = self.types[step.type].reference
            outputs[step.id] = ref(StepContext(task, step, plan, outputs)) if ref else ""
        return outputs

    def demonstrations(self, task: Task) -> list[tuple[str, str, str]]:
        """SFT rows ``(who, observation, target)`` of ``task``: the planner's (who "planner",
        the rule plan), each step of the rule plan on reference inputs (who: its type) and the
        whole task (who :data:`WHOLE`). Observations are exactly what ``Decompose-v0`` shows."""
        seen = visible(task)  # what the planner and the specialists read: the text
        plan = self.rule_plan(seen)
        outputs = self.reference_outputs(task, plan)
        rows = [("planner", self.planner_prompt(seen), plan.text)]
        for step in plan.steps:
            done = {s.id: outputs[s.id] for s in plan.steps[:plan.steps.index(step)]}
            ctx = StepContext(seen, step, plan, done)
            rows.append((step.type, self.types[step.type].observe(ctx), outputs[step.id]))
        rows.append((WHOLE, self.whole_prompt(seen), self.answer(task, plan, outputs)))
        return rows

    def splits(self, train_size: int, eval_size: int, seed: int) -> tuple[list[Task], list[Task]]:
        """(train, eval) tasks, deterministic in ``seed``; no eval task text is in train."""
        rng = random.Random(seed)
        seen: set[str] = set()
        tasks: list[Task] = []
        attempts = 0
        while len(tasks) < train_size + eval_size:
            attempts += 1
            if attempts > 50 * (train_size + eval_size) + 1000:
                raise ValueError(f"family {type(self).__name__} has fewer than "
                                 f"{train_size + eval_size} distinct tasks with these options")
            task = self.make_task(rng, len(tasks))
            if task.text in seen:
                continue
            seen.add(task.text)
            tasks.append(task)
        held_out, train = tasks[:eval_size], tasks[eval_size:]
        return ([Task(f"train/{i}", t.text, t.data) for i, t in enumerate(train)],
                [Task(f"eval/{i}", t.text, t.data) for i, t in enumerate(held_out)])


FAMILIES: Registry[type[TaskFamily]] = Registry("task family")


def make_family(name: str, options: Mapping[str, Any] | None = None) -> TaskFamily:
    """The registered family ``name`` built with ``options`` (validated by its options model).
    The built-in families are registered by the package (``agentrt.decomposer``) on import."""
    return FAMILIES.get(name)(**dict(options or {}))
