"""Word-problem chains: parse the quantities, compute each intermediate, format the answer.

"tom has 3 bags of 7 pens and gives 5 away" is ``3 * 7 - 5``: the rule plan is
``parse > mul > sub > format``. The six templates fold three numbers left to right with two of
``add``, ``sub``, ``mul``, ``div``, so a planner must read the words to pick the operations: the
rule planner reads them by their cue words ("bags of" multiplies, "gives" subtracts, ...), in the
order they come (:func:`read_ops`), as the LM planner and the generalist read the same text.

Subtasks (each verified on what its own observation shows, so an upstream mistake is never a
downstream specialist's fault):

- ``parse``:  "parse: <task>"  -> "3 7 5"
- ``add``/``sub``/``mul``/``div``: "mul 3 7"  -> "21" (the first operation reads the first two
  numbers, each later one the previous result and the next number)
- ``format``: "format 16: tom has 3 bags of 7 pens and gives 5 away" -> "16 pens", the task's
  answer (the item is read from the words, as the generalist reads it)
"""

from __future__ import annotations

import random
import re
from typing import Any

from pydantic import Field

from agentrt.decomposer.plan import Plan
from agentrt.decomposer.sdk import (FAMILIES, FamilyOptions, StepContext, SubtaskType, Task,
                                    TaskFamily, Verdict)

NAMES = ("tom", "ana", "li", "sam", "kim", "max", "eva", "raj")
ITEMS = ("pens", "cups", "apples", "books", "coins", "cards")
OPS = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
       "div": lambda x, y: x // y}
# (text with {n} {a} {b} {c} {item}, first op, second op)
TEMPLATES = (
    ("{n} has {a} bags of {b} {item} and gives {c} away", "mul", "sub"),
    ("{n} has {a} {item}, buys {b} more and shares them among {c} friends", "add", "div"),
    ("{n} has {a} {item}, gives {b} away and buys {c} more", "sub", "add"),
    ("{n} has {a} rows of {b} {item} and {c} more", "mul", "add"),
    ("{n} has {a} {item} and finds {b} more, then gets {c} times as many", "add", "mul"),
    ("{n} has {a} {item}, loses {b} and packs the rest into {c} boxes", "sub", "div"),
)
_INT = re.compile(r"-?\d+")
# The words that name each operation, as the templates use them (a rule planner's reading).
CUES = re.compile(r"\b(?:(?P<mul>bags of|rows of|times as many)|(?P<add>buys|finds|and \d+ more)"
                  r"|(?P<sub>gives|loses)|(?P<div>shares|packs))\b")


class WordChainOptions(FamilyOptions):
    low: int = Field(2, ge=1, description="Smallest quantity in a problem.")
    high: int = Field(9, ge=2, le=99, description="Largest quantity in a problem.")


def _ints(text: str) -> list[int] | None:
    """The integers of ``text`` when it holds nothing else (None otherwise)."""
    parts = text.split()
    if not parts or not all(_INT.fullmatch(p) for p in parts):
        return None
    return [int(p) for p in parts]


def _number(text: str) -> int | None:
    found = _ints(text)
    return found[0] if found is not None and len(found) == 1 else None


def operands(ctx: StepContext) -> tuple[int, int] | None:
    """(x, y) of an arithmetic step: the first reads numbers 0 and 1 of the parse step, each later
    one the output of the step it reads and the next number. None when an input is unusable."""
    numbers = _ints(ctx.output_of("parse") or "")
    k = sum(ctx.index(op) for op in OPS)
    if numbers is None or len(numbers) < k + 2:
        return None
    if k == 0:
        return numbers[0], numbers[1]
    x = _number(ctx.inputs[0]) if ctx.inputs else None
    return None if x is None else (x, numbers[k + 1])


def _op_type(name: str) -> SubtaskType:
    symbol = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[name]

    def observe(ctx: StepContext) -> str:
        xy = operands(ctx)
        return f"{name} {xy[0]} {xy[1]}\n" if xy else f"{name} ? ?\n"

    def verify(ctx: StepContext, out: str) -> Verdict:
        xy = operands(ctx)
        if xy is None:
            return Verdict(False, "no operands: an earlier step gave no usable number")
        if name == "div" and xy[1] == 0:
            return Verdict(False, "division by zero")
        want = OPS[name](*xy)
        got = _number(out)
        return Verdict(got == want, "" if got == want else f"{xy[0]}{symbol}{xy[1]} is {want}, "
                                                          f"not {out.strip()[:12]!r}")

    def reference(ctx: StepContext) -> str:
        xy = operands(ctx)
        return str(OPS[name](*xy)) if xy and not (name == "div" and xy[1] == 0) else "0"

    return SubtaskType(name, f"the {name} of two numbers", observe, verify, reference,
                       max_tokens=5)


def _parse_verify(ctx: StepContext, out: str) -> Verdict:
    want = list(ctx.task.data["numbers"])
    got = _ints(out)
    return Verdict(got == want, "" if got == want else f"expected {want}, got {out.strip()[:20]!r}")


def read_ops(text: str) -> list[str]:
    """The operations a problem's words name, in the order they come ("tom has 3 bags of 7 pens
    and gives 5 away" -> ["mul", "sub"])."""
    return [m.lastgroup for m in CUES.finditer(text) if m.lastgroup]


def _format_observe(ctx: StepContext) -> str:
    value = ctx.inputs[0].strip() if ctx.inputs else ""
    return f"format {value}: {ctx.task.text}\n"


def _format_verify(ctx: StepContext, out: str) -> Verdict:
    value = _number(ctx.inputs[0]) if ctx.inputs else None
    want = f"{value} {ctx.task.data['item']}"
    return Verdict(value is not None and out.strip() == want, f"expected {want!r}")


PARSE = SubtaskType("parse", "the quantities of the problem, in order",
                    observe=lambda ctx: f"parse: {ctx.task.text}\n", verify=_parse_verify,
                    reference=lambda ctx: " ".join(map(str, ctx.task.data["numbers"])),
                    max_tokens=10)
FORMAT = SubtaskType("format", "the answer as '<number> <item>'", observe=_format_observe,
                     verify=_format_verify,
                     reference=lambda ctx: (f"{_number(ctx.inputs[0]) if ctx.inputs else ''} "
                                            f"{ctx.task.data['item']}"),
                     max_tokens=12)


@FAMILIES.register("wordchain")
class WordChain(TaskFamily):
    """Multi-step word problems (see the module docstring)."""

    subtask_types = (PARSE, *(_op_type(op) for op in OPS), FORMAT)
    options_model = WordChainOptions
    whole_tokens = 12

    def make_task(self, rng: random.Random, index: int) -> Task:
        lo, hi = self.options.low, self.options.high
        while True:
            text, op1, op2 = rng.choice(TEMPLATES)
            a, b, c = rng.randint(lo, hi), rng.randint(lo, hi), rng.randint(lo, hi)
            first = OPS[op1](a, b)
            if first < 0 or (op2 == "div" and (c == 0 or first % c)) or OPS[op2](first, c) < 0:
                continue
            if op1 == "div" and (b == 0 or a % b):
                continue
            item = rng.choice(ITEMS)
            data: dict[str, Any] = {"numbers": [a, b, c], "ops": [op1, op2], "item": item,
                                    "value": OPS[op2](first, c)}
            return Task(f"wordchain/{index}",
                        text.format(n=rng.choice(NAMES), a=a, b=b, c=c, item=item), data)

    def rule_plan(self, task: Task) -> Plan:
        return Plan.chain(["parse", *read_ops(task.text), "format"])

    def verify(self, task: Task, answer: str) -> Verdict:
        want = f"{task.data['value']} {task.data['item']}"
        return Verdict(answer.strip() == want, f"expected {want!r}, got {answer.strip()[:20]!r}")
