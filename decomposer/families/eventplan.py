"""Event plans: a live-stream sale of a few products, picked, scheduled and scripted.

"sell 3 in 8m for $18, hat last: mug $5 2m, lamp $9 3m, hat $4 1m, pen $7 2m" asks for 3 of the
products (prices summing to at most $18, segments of at most 8 minutes in all, the hat among
them), an order with start times that keeps the rule, and one script line per segment. The rule
plan is ``select > schedule > script``; the whole answer is the schedule and the script::

    mug@0 pen@2 hat@4 | mug: $5 | pen: $7 | hat: $4

A rule is "x before y", "x first" or "x last"; the products it names must be sold. Budget and
window are set from one valid choice, and every task has some choice that breaks them, so picking
is a small search, not a copy.

Subtasks (each verified on what its own observation shows, so an upstream mistake is never a
downstream specialist's fault; a step whose input is unusable fails with a reason saying so):

- ``select``:   "pick 3, $18, 8m, hat last: mug $5 2m, ..." -> "mug pen hat" (any valid choice;
  the reference is the first in listed order, "mug lamp hat")
- ``schedule``: "order in 8m, hat last: mug 2m, pen 2m, hat 1m" -> "mug@0 pen@2 hat@4" (any
  order and start times without overlaps, inside the window, keeping the rule)
- ``script``:   "script: mug $5, pen $7, hat $4" -> "mug: $5 | pen: $7 | hat: $4" (one part per
  segment in time order, "<product>: <pitch>", the pitch stating the product's price)
"""

from __future__ import annotations

import itertools
import random
import re
from typing import Any, Sequence

from pydantic import Field

from agentrt.decomposer.plan import Plan
from agentrt.decomposer.sdk import (FAMILIES, FamilyOptions, StepContext, SubtaskType, Task,
                                    TaskFamily, Verdict)

# Short names, none a prefix or part of another, so a line names exactly one product.
PRODUCTS = ("mug", "lamp", "hat", "pen", "bag", "sock", "fan", "kite", "bell", "soap", "tea",
            "jam", "ring", "vase", "rug", "cup")
_SEGMENT = re.compile(r"([a-z]+)@(\d{1,3})")
_PRICE = re.compile(r"\$(\d+)")

Segments = list[tuple[str, int]]  # (product, start minute), in time order


class EventPlanOptions(FamilyOptions):
    products: int = Field(4, ge=4, le=6, description="Products listed in a task.")
    max_price: int = Field(9, ge=3, le=20, description="Highest price of a product, in dollars.")
    max_minutes: int = Field(3, ge=1, le=5, description="Longest segment, in minutes.")


# ---------------------------------------------------------------------- task facts
def _catalog(task: Task) -> dict[str, tuple[int, int]]:
    """Product -> (price, minutes), from the task's data (verifiers and references)."""
    return {name: (price, minutes) for name, price, minutes in task.data["products"]}


_TEXT = re.compile(r"sell (\d+) in (\d+)m for \$(\d+), (.+?): (.+)")
_LISTED = re.compile(r"([a-z]+) \$(\d+) (\d+)m")


def read_task(text: str) -> dict[str, Any]:
    """The facts a task's text states, in ``data``'s shape ("sell 3 in 8m for $18, hat last:
    mug $5 2m, ..." -> k, window, budget, rule, products): what observation builders read, as
    the generalist reads the same text. Raises ValueError on a text not in that form."""
    found = _TEXT.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"not an event-plan task: {text[:40]!r}")
    k, window, budget, rule, listing = found.groups()
    words = rule.split()
    parsed = (words[1], words[0], words[2]) if len(words) == 3 else (words[1], words[0])
    return {"k": int(k), "window": int(window), "budget": int(budget), "rule": parsed,
            "products": [(n, int(p), int(m)) for n, p, m in _LISTED.findall(listing)]}


def _seen_catalog(ctx: StepContext) -> dict[str, tuple[int, int]]:
    """Product -> (price, minutes), as the task's text states them (observation builders)."""
    return {name: (price, minutes) for name, price, minutes in
            read_task(ctx.task.text)["products"]}


def rule_text(rule: Sequence[str]) -> str:
    """("before", "mug", "hat") -> "mug before hat"; ("last", "hat") -> "hat last"."""
    return f"{rule[1]} before {rule[2]}" if rule[0] == "before" else f"{rule[1]} {rule[0]}"


def _rule_names(rule: Sequence[str]) -> list[str]:
    return list(rule[1:])


# ---------------------------------------------------------------------- parsing outputs
def _names(text: str, catalog: dict[str, Any]) -> list[str] | None:
    """The products of a selection ("mug pen hat"; commas allowed); None if any is unknown."""
    names = text.replace(",", " ").split()
    return names if names and all(n in catalog for n in names) else None


def _segments(text: str, catalog: dict[str, Any]) -> Segments | None:
    """A schedule "mug@0 pen@2" in time order; None if it is not one of known products."""
    parts = text.split()
    found = [_SEGMENT.fullmatch(p) for p in parts]
    if not parts or any(m is None or m.group(1) not in catalog for m in found):
        return None
    return sorted(((m.group(1), int(m.group(2))) for m in found if m), key=lambda s: s[1])


# ---------------------------------------------------------------------- checks (reason or None)
def _check_selection(task: Task, names: list[str]) -> str | None:
    catalog, k = _catalog(task), task.data["k"]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        return f"{dupes[0]} is picked twice"
    if len(names) != k:
        return f"{len(names)} products picked, not {k}"
    missing = [n for n in _rule_names(task.data["rule"]) if n not in names]
    if missing:
        return f"{missing[0]} must be sold ({rule_text(task.data['rule'])})"
    cost = sum(catalog[n][0] for n in names)
    if cost > task.data["budget"]:
        return f"over budget: ${cost} > ${task.data['budget']}"
    minutes = sum(catalog[n][1] for n in names)
    if minutes > task.data["window"]:
        return f"too long: {minutes}m > {task.data['window']}m"
    return None


def _check_schedule(task: Task, segments: Segments, selected: list[str]) -> str | None:
    """The schedule sells exactly ``selected``, without overlaps, inside the window, keeping
    the rule."""
    catalog, window, rule = _catalog(task), task.data["window"], task.data["rule"]
    names = [n for n, _ in segments]
    if sorted(names) != sorted(selected):
        return f"the segments are {' '.join(names)}, not the selection {' '.join(selected)}"
    missing = [n for n in _rule_names(rule) if n not in names]
    if missing:
        return f"no order keeps {rule_text(rule)}: {missing[0]} is not selected"
    need = sum(catalog[n][1] for n in names)
    if need > window:
        return f"the selection needs {need}m, more than the {window}m window"
    for (a, start), (b, nxt) in zip(segments, segments[1:]):
        if start + catalog[a][1] > nxt:
            return f"{a} ({start}-{start + catalog[a][1]}m) overlaps {b} at {nxt}m"
    last, start = segments[-1]
    if start + catalog[last][1] > window:
        return f"{last} ends at {start + catalog[last][1]}m, after the {window}m window"
    order = {n: i for i, n in enumerate(names)}
    broken = ((rule[0] == "before" and order[rule[1]] > order[rule[2]])
              or (rule[0] == "first" and order[rule[1]] != 0)
              or (rule[0] == "last" and order[rule[1]] != len(names) - 1))
    return f"breaks the rule {rule_text(rule)}" if broken else None


def _check_script(task: Task, parts: list[str], order: list[str]) -> str | None:
    """One part "<product>: <pitch>" per segment, in time order, each pitch stating its price."""
    catalog = _catalog(task)
    if len(parts) != len(order):
        return f"{len(parts)} script parts for {len(order)} segments"
    for i, (part, want) in enumerate(zip(parts, order), 1):
        head, colon, pitch = part.partition(":")
        if not colon or head.strip() != want:
            return f"part {i} must start '{want}:', got {part.strip()[:16]!r}"
        others = [n for n in catalog if n != want and n in pitch.replace(",", " ").split()]
        if others:
            return f"part {i} ({want}) names {others[0]}"
        prices = _PRICE.findall(pitch)
        if not prices or any(int(p) != catalog[want][0] for p in prices):
            return f"part {i} must state {want}'s price ${catalog[want][0]}"
    return None


# ---------------------------------------------------------------------- subtask types
def _selected(ctx: StepContext) -> list[str] | None:
    """The products the select step chose (None when its output names an unknown one)."""
    return _names(ctx.output_of("select") or "", _catalog(ctx.task))


def _scheduled(ctx: StepContext) -> Segments | None:
    return _segments(ctx.output_of("schedule") or "", _catalog(ctx.task))


def _select_observe(ctx: StepContext) -> str:
    d = read_task(ctx.task.text)
    return f"pick {d['k']}, ${d['budget']}, {d['window']}m, {rule_text(d['rule'])}: " \
           f"{_listing(d['products'])}\n"


def _select_verify(ctx: StepContext, out: str) -> Verdict:
    names = _names(out, _catalog(ctx.task))
    if names is None:
        return Verdict(False, f"not a list of listed products: {out.strip()[:20]!r}")
    reason = _check_selection(ctx.task, names)
    return Verdict(reason is None, reason or "")


def _select_reference(ctx: StepContext) -> str:
    return " ".join(canonical_selection(ctx.task))


def _schedule_observe(ctx: StepContext) -> str:
    d, catalog = read_task(ctx.task.text), _seen_catalog(ctx)
    selected = _names(ctx.output_of("select") or "", catalog)
    if selected is None:
        return "order ?\n"
    return f"order in {d['window']}m, {rule_text(d['rule'])}: " \
           f"{', '.join(f'{n} {catalog[n][1]}m' for n in selected)}\n"


def _schedule_verify(ctx: StepContext, out: str) -> Verdict:
    selected = _selected(ctx)
    if selected is None or len(set(selected)) != len(selected):
        return Verdict(False, "no usable selection: the select step's output is not one")
    segments = _segments(out, _catalog(ctx.task))
    if segments is None:
        return Verdict(False, f"not a schedule 'name@start ...': {out.strip()[:20]!r}")
    reason = _check_schedule(ctx.task, segments, selected)
    return Verdict(reason is None, reason or "")


def _schedule_reference(ctx: StepContext) -> str:
    return _format_segments(ctx.task, reference_order(ctx.task, _selected(ctx) or []))


def _script_observe(ctx: StepContext) -> str:
    catalog = _seen_catalog(ctx)
    segments = _segments(ctx.output_of("schedule") or "", catalog)
    if segments is None:
        return "script: ?\n"
    return f"script: {', '.join(f'{n} ${catalog[n][0]}' for n, _ in segments)}\n"


def _script_verify(ctx: StepContext, out: str) -> Verdict:
    segments = _scheduled(ctx)
    if segments is None:
        return Verdict(False, "no usable schedule: the schedule step's output is not one")
    reason = _check_script(ctx.task, out.split("|"), [n for n, _ in segments])
    return Verdict(reason is None, reason or "")


def _script_reference(ctx: StepContext) -> str:
    return _format_script(ctx.task, [n for n, _ in _scheduled(ctx) or []])


SELECT = SubtaskType("select", "the products to sell, e.g. 'mug pen hat'", _select_observe,
                     _select_verify, _select_reference, max_tokens=16)
SCHEDULE = SubtaskType("schedule", "the segments with start minutes, e.g. 'mug@0 pen@2'",
                       _schedule_observe, _schedule_verify, _schedule_reference, max_tokens=28)
SCRIPT = SubtaskType("script", "one '<product>: <pitch with its price>' per segment, joined by |",
                     _script_observe, _script_verify, _script_reference, max_tokens=36)


# ---------------------------------------------------------------------- references
def _listing(products: Sequence[Sequence[Any]]) -> str:
    return ", ".join(f"{n} ${p} {m}m" for n, p, m in products)


def canonical_selection(task: Task) -> list[str]:
    """The first valid choice of k products in listed order (the select reference)."""
    names = [p[0] for p in task.data["products"]]
    for combo in itertools.combinations(names, task.data["k"]):
        if _check_selection(task, list(combo)) is None:
            return list(combo)
    raise ValueError(f"task {task.id} has no valid selection")  # make_task never makes one


def reference_order(task: Task, selected: list[str]) -> list[str]:
    """``selected`` in written order, moved as little as the rule needs."""
    order, rule = list(selected), task.data["rule"]
    if rule[1] not in order:
        return order
    if rule[0] == "first":
        order.remove(rule[1])
        order.insert(0, rule[1])
    elif rule[0] == "last":
        order.remove(rule[1])
        order.append(rule[1])
    elif rule[2] in order and order.index(rule[1]) > order.index(rule[2]):
        order.remove(rule[1])
        order.insert(order.index(rule[2]), rule[1])
    return order


def _format_segments(task: Task, order: list[str]) -> str:
    catalog, start, parts = _catalog(task), 0, []
    for name in order:
        parts.append(f"{name}@{start}")
        start += catalog[name][1]
    return " ".join(parts)


def _format_script(task: Task, order: list[str]) -> str:
    catalog = _catalog(task)
    return " | ".join(f"{n}: ${catalog[n][0]}" for n in order)


@FAMILIES.register("eventplan")
class EventPlan(TaskFamily):
    """Live-stream sale plans (see the module docstring)."""

    subtask_types = (SELECT, SCHEDULE, SCRIPT)
    options_model = EventPlanOptions
    # the longest answer is 59 characters: "kite@0 ...@15 ...@15 | kite: $20 | ... | ...: $20"
    whole_tokens = 64

    def make_task(self, rng: random.Random, index: int) -> Task:
        opts = self.options
        while True:
            names = rng.sample(PRODUCTS, opts.products)
            products = [(n, rng.randint(1, opts.max_price), rng.randint(1, opts.max_minutes))
                        for n in names]
            k = rng.choice((2, 3))
            kind = rng.choice(("before", "first", "last") if k == 3 else ("first", "last"))
            rule = (kind, *rng.sample(names, 2 if kind == "before" else 1))
            choices = [list(c) for c in itertools.combinations(names, k)
                       if set(rule[1:]) <= set(c)]
            target = rng.choice(choices)
            catalog = {n: (p, m) for n, p, m in products}
            data: dict[str, Any] = {
                "products": products, "k": k, "rule": rule,
                "budget": sum(catalog[n][0] for n in target) + rng.randint(0, 2),
                "window": sum(catalog[n][1] for n in target) + rng.randint(0, 1)}
            task = Task(f"eventplan/{index}", "", data)
            if all(_check_selection(task, c) is None for c in choices):
                continue  # every choice is fine: nothing to search for
            text = (f"sell {k} in {data['window']}m for ${data['budget']}, {rule_text(rule)}: "
                    f"{_listing(products)}")
            return Task(task.id, text, data)

    def rule_plan(self, task: Task) -> Plan:
        return Plan.chain(["select", "schedule", "script"])

    def answer(self, task: Task, plan: Plan, outputs: dict[int, str]) -> str:
        """The schedule and the script: "mug@0 pen@2 hat@4 | mug: $5 | pen: $7 | hat: $4" (a
        plan without either, such as the single whole step, answers with its last output)."""
        latest = {s.type: outputs[s.id].strip() for s in plan.steps if s.id in outputs}
        if not {"schedule", "script"} & latest.keys():
            return super().answer(task, plan, outputs)
        return f"{latest.get('schedule', '')} | {latest.get('script', '')}"

    def verify(self, task: Task, answer: str) -> Verdict:
        schedule, *script = answer.split("|")
        segments = _segments(schedule, _catalog(task))
        if segments is None:
            return Verdict(False, f"no schedule 'name@start ...' before the first |: "
                                  f"{schedule.strip()[:20]!r}")
        names = [n for n, _ in segments]
        reason = (_check_selection(task, names) or _check_schedule(task, segments, names)
                  or _check_script(task, script, names))
        return Verdict(reason is None, reason or "")
