"""Shopping bills: quantities read from the words, prices looked up in the shop's price list by
a tool, the bill computed from what the tool answered.

"ana buys 3 pens and 2 cups" -> "26". The shop's price list (:data:`PRICES`: 48 goods at $1-$19,
fixed) is a knowledge base the environment holds: it is not in the task's text, so whoever does
a lookup must either call the shop's tool (:func:`lookup_tool`, a Python specialist) or have
learnt the prices, as a generalist answering in one step must. The rule plan is
``parse > lookup > total``:

- ``parse``:  "parse: ana buys 3 pens and 2 cups" -> "3 pens 2 cups"
- ``lookup``: "lookup: pens cups" -> "pens 4 cups 7" (the goods the parse step read)
- ``total``:  "total: 3 pens 2 cups | pens 4 cups 7" -> "26" (the parse step's quantities times
  the prices the lookup step answered)

Each step is verified on what its own observation shows, so an upstream mistake is never a
downstream specialist's fault.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field

from agentrt.decomposer.plan import Plan
from agentrt.decomposer.sdk import (FAMILIES, FamilyOptions, StepContext, SubtaskType, Task,
                                    TaskFamily, Verdict)

GOODS = ("pens", "cups", "mugs", "hats", "maps", "bags", "socks", "fans", "kites", "bells",
         "rings", "rugs", "vases", "jars", "bowls", "forks", "spoons", "plates", "lamps",
         "clocks", "books", "cards", "coins", "dice", "keys", "locks", "nails", "ropes", "tapes",
         "pins", "combs", "brushes", "soaps", "towels", "sheets", "pillows", "candles", "boxes",
         "tubes", "wires", "bulbs", "chalks", "inks", "pads", "files", "clips", "glues", "stamps")
_prices = random.Random(20261207)
PRICES: dict[str, int] = {good: _prices.randint(1, 19) for good in GOODS}  # the shop's list
NAMES = ("tom", "ana", "li", "sam", "kim", "max", "eva", "raj")

Bill = list[tuple[int, str]]  # (quantity, good)


class ShoppingOptions(FamilyOptions):
    max_quantity: int = Field(9, ge=1, le=99, description="Largest quantity of one good.")
    max_goods: int = Field(3, ge=1, le=4, description="Most goods in one task (at least 1).")


def read_bill(text: str) -> Bill | None:
    """``[(3, "pens"), (2, "cups")]`` of "3 pens 2 cups"; None unless it is quantity-good pairs
    of known goods."""
    words = text.split()
    if not words or len(words) % 2:
        return None
    pairs = list(zip(words[::2], words[1::2]))
    if not all(q.isdigit() and g in PRICES for q, g in pairs):
        return None
    return [(int(q), g) for q, g in pairs]


def read_prices(text: str) -> dict[str, int] | None:
    """``{"pens": 4, "cups": 7}`` of "pens 4 cups 7"; None unless it is good-price pairs."""
    words = text.split()
    if not words or len(words) % 2:
        return None
    pairs = list(zip(words[::2], words[1::2]))
    if not all(p.isdigit() for _, p in pairs):
        return None
    return {g: int(p) for g, p in pairs}


def _bill_text(bill: Bill) -> str:
    return " ".join(f"{q} {g}" for q, g in bill)


def _prices_text(goods: list[str]) -> str:
    return " ".join(f"{g} {PRICES[g]}" for g in goods)


def lookup_tool(request: Any) -> str:
    """The shop's price tool (``tools: [{fn: "agentrt.decomposer.families.shopping:lookup_tool",
    skills: [lookup]}]``): "lookup: pens cups" -> "pens 4 cups 7" ("?" for a good the shop does
    not sell)."""
    words = request.observation.strip().splitlines()[-1].split()
    return " ".join(f"{g} {PRICES.get(g, '?')}" for g in words[1:])


# ---------------------------------------------------------------------- subtask types
def _parse_verify(ctx: StepContext, out: str) -> Verdict:
    want = _bill_text([tuple(item) for item in ctx.task.data["items"]])
    return Verdict(out.split() == want.split(), f"expected {want!r}")


def _parsed(ctx: StepContext) -> Bill | None:
    return read_bill(ctx.output_of("parse") or "")


def _lookup_observe(ctx: StepContext) -> str:
    bill = _parsed(ctx)
    return f"lookup: {' '.join(g for _, g in bill)}\n" if bill else "lookup: ?\n"


def _lookup_verify(ctx: StepContext, out: str) -> Verdict:
    bill = _parsed(ctx)
    if bill is None:
        return Verdict(False, "no goods: the parse step gave no usable bill")
    want = _prices_text([g for _, g in bill])
    return Verdict(out.split() == want.split(), f"expected {want!r}")


def _total_inputs(ctx: StepContext) -> tuple[Bill, dict[str, int]] | None:
    bill, prices = _parsed(ctx), read_prices(ctx.inputs[0] if ctx.inputs else "")
    if bill is None or prices is None or any(g not in prices for _, g in bill):
        return None
    return bill, prices


def _total_observe(ctx: StepContext) -> str:
    found = _total_inputs(ctx)
    if found is None:
        return "total: ?\n"
    bill, prices = found
    return f"total: {_bill_text(bill)} | {' '.join(f'{g} {prices[g]}' for _, g in bill)}\n"


def _total_reference(ctx: StepContext) -> str:
    found = _total_inputs(ctx)
    return str(sum(q * found[1][g] for q, g in found[0])) if found else "0"


def _total_verify(ctx: StepContext, out: str) -> Verdict:
    if _total_inputs(ctx) is None:
        return Verdict(False, "no bill and prices: an earlier step gave no usable output")
    want = _total_reference(ctx)
    return Verdict(out.strip() == want, f"expected {want}, got {out.strip()[:8]!r}")


PARSE = SubtaskType("parse", "the quantities and goods bought, e.g. '3 pens 2 cups'",
                    observe=lambda ctx: f"parse: {ctx.task.text}\n", verify=_parse_verify,
                    reference=lambda ctx: _bill_text(
                        [tuple(item) for item in ctx.task.data["items"]]), max_tokens=36)
LOOKUP = SubtaskType("lookup", "each good's price from the shop's list, e.g. 'pens 4 cups 7'",
                     observe=_lookup_observe, verify=_lookup_verify,
                     reference=lambda ctx: _prices_text([g for _, g in _parsed(ctx) or []]),
                     max_tokens=40)
TOTAL = SubtaskType("total", "the bill: quantities times the looked-up prices, summed",
                    observe=_total_observe, verify=_total_verify, reference=_total_reference,
                    max_tokens=4)


@FAMILIES.register("shopping")
class Shopping(TaskFamily):
    """Shopping bills over the shop's price list (see the module docstring)."""

    subtask_types = (PARSE, LOOKUP, TOTAL)
    options_model = ShoppingOptions
    whole_tokens = 4

    def make_task(self, rng: random.Random, index: int) -> Task:
        opts = self.options
        goods = rng.sample(GOODS, rng.randint(min(2, opts.max_goods), opts.max_goods))
        bill = [(rng.randint(1, opts.max_quantity), g) for g in goods]
        said = [f"{q} {g}" for q, g in bill]
        listed = said[0] if len(said) == 1 else f"{', '.join(said[:-1])} and {said[-1]}"
        data = {"items": [list(item) for item in bill],
                "total": sum(q * PRICES[g] for q, g in bill)}
        return Task(f"shopping/{index}", f"{rng.choice(NAMES)} buys {listed}", data)

    def rule_plan(self, task: Task) -> Plan:
        return Plan.chain(["parse", "lookup", "total"])

    def verify(self, task: Task, answer: str) -> Verdict:
        want = str(task.data["total"])
        return Verdict(answer.strip() == want, f"expected {want}, got {answer.strip()[:8]!r}")
