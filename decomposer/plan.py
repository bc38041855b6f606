"""Plans: a chain or DAG of subtasks in a parseable text format, and their validation.

Two spellings, both parsed by :func:`parse_plan`:

- a chain, each step using the one before: ``parse > mul > sub > format``;
- a DAG with named steps and their inputs: ``a=parse; b=mul(a); c=sub(b); d=format(c)``.

A plan that cannot be used is a :class:`PlanError` with a ``kind`` ("unparseable",
"unknown_subtask", "cycle", "over_budget") and a one-line reason; the decomposer env records it as
the chain's outcome and never crashes on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PLAN_ERRORS = ("unparseable", "unknown_subtask", "cycle", "over_budget")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_DAG_STEP = re.compile(rf"^\s*({_NAME})\s*=\s*({_NAME})\s*(?:\(\s*([^)]*)\))?\s*$")


class PlanError(ValueError):
    """A plan that cannot run; ``kind`` is one of :data:`PLAN_ERRORS`."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind, self.reason = kind, reason


@dataclass(frozen=True)
class Step:
    """One subtask of a plan: its id (position in the written plan), type and input steps."""

    id: int
    type: str
    deps: tuple[int, ...] = ()


@dataclass(frozen=True)
class Plan:
    """Steps in execution order (a topological order of the DAG)."""

    steps: tuple[Step, ...]
    text: str = field(default="", compare=False)

    @classmethod
    def chain(cls, types: list[str] | tuple[str, ...]) -> Plan:
        steps = tuple(Step(i, t, (i - 1,) if i else ()) for i, t in enumerate(types))
        return cls(steps, format_plan_types(types))

    @property
    def types(self) -> list[str]:
        return [s.type for s in self.steps]

    def __len__(self) -> int:
        return len(self.steps)


def format_plan_types(types: list[str] | tuple[str, ...]) -> str:
    """The chain spelling of a list of subtask types."""
    return " > ".join(types)


def format_plan(plan: Plan) -> str:
    """The chain spelling when the plan is a chain, else the DAG spelling."""
    if all(s.deps == ((i - 1,) if i else ()) for i, s in enumerate(plan.steps)):
        return format_plan_types(plan.types)
    names = {s.id: f"s{s.id}" for s in plan.steps}
    return "; ".join(f"{names[s.id]}={s.type}"
                     + (f"({','.join(names[d] for d in s.deps)})" if s.deps else "")
                     for s in plan.steps)


def parse_plan(text: str, known: set[str] | frozenset[str], max_steps: int,
               budgets: dict[str, int] | None = None, token_budget: int | None = None) -> Plan:
    """Parses and validates a plan.

    Args:
        text: The plan as written (chain or DAG spelling; surrounding whitespace ignored).
        known: Subtask types the family defines.
        max_steps: More steps than this is "over_budget".
        budgets: Token budget of each subtask type (for ``token_budget``).
        token_budget: The plan's steps may spend at most this many tokens in all.

    Raises:
        PlanError: unparseable, unknown subtask, cycle or over budget.
    """
    body = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not body:
        raise PlanError("unparseable", "the plan is empty")
    steps = _parse_dag(body) if "=" in body else _parse_chain(body)
    unknown = sorted({s.type for s in steps} - set(known))
    if unknown:
        raise PlanError("unknown_subtask", f"unknown subtask type {unknown[0]!r}; known: "
                        f"{', '.join(sorted(known))}")
    if len(steps) > max_steps:
        raise PlanError("over_budget", f"{len(steps)} steps; at most {max_steps} allowed")
    if token_budget is not None and budgets is not None:
        spent = sum(budgets.get(s.type, 0) for s in steps)
        if spent > token_budget:
            raise PlanError("over_budget", f"the steps may spend {spent} tokens; the budget "
                            f"is {token_budget}")
    return Plan(tuple(_topological(steps)), body)


def _parse_chain(body: str) -> list[Step]:
    parts = [p.strip() for p in body.split(">")]
    if any(not re.fullmatch(_NAME, p) for p in parts):
        raise PlanError("unparseable", f"not a chain 'a > b > c' of subtask names: {body[:60]!r}")
    return [Step(i, t, (i - 1,) if i else ()) for i, t in enumerate(parts)]


def _parse_dag(body: str) -> list[Step]:
    names: dict[str, int] = {}
    raw: list[tuple[str, str, list[str]]] = []
    for part in [p for p in body.split(";") if p.strip()]:
        m = _DAG_STEP.match(part)
        if m is None:
            raise PlanError("unparseable", f"not a step 'name=type(inputs)': {part.strip()[:40]!r}")
        name, kind, args = m.group(1), m.group(2), m.group(3) or ""
        if name in names:
            raise PlanError("unparseable", f"step name {name!r} is used twice")
        names[name] = len(raw)
        raw.append((name, kind, [a.strip() for a in args.split(",") if a.strip()]))
    steps = []
    for i, (name, kind, args) in enumerate(raw):
        missing = [a for a in args if a not in names]
        if missing:
            raise PlanError("unparseable", f"step {name!r} reads {missing[0]!r}, which no step "
                            "defines")
        steps.append(Step(i, kind, tuple(names[a] for a in args)))
    return steps


def _topological(steps: list[Step]) -> list[Step]:
    """Kahn's algorithm, ties in written order; a cycle raises with the steps on it."""
    indegree = {s.id: len(set(s.deps)) for s in steps}
    users: dict[int, list[int]] = {s.id: [] for s in steps}
    for s in steps:
        for d in set(s.deps):
            users[d].append(s.id)
    by_id = {s.id: s for s in steps}
    ready = sorted(i for i, n in indegree.items() if n == 0)
    order: list[Step] = []
    while ready:
        i = ready.pop(0)
        order.append(by_id[i])
        for u in users[i]:
            indegree[u] -= 1
            if indegree[u] == 0:
                ready.append(u)
        ready.sort()
    if len(order) < len(steps):
        stuck = {i for i, n in indegree.items() if n > 0}
        # Steps on a cycle reach themselves through their inputs; others only wait on one.
        on_cycle = [by_id[i].type for i in sorted(stuck) if _reaches(by_id, i, i)]
        raise PlanError("cycle", f"steps {' -> '.join(on_cycle)} depend on each other")
    return order


def _reaches(by_id: dict[int, Step], start: int, target: int) -> bool:
    """Whether ``target`` is among the inputs of ``start``, directly or not."""
    seen: set[int] = set()
    todo = list(by_id[start].deps)
    while todo:
        i = todo.pop()
        if i == target:
            return True
        if i not in seen:
            seen.add(i)
            todo.extend(by_id[i].deps)
    return False
