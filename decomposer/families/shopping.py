"""Shopping bills: quantities read from the words, prices looked up in the shop's price list by
a tool, each good's cost and the bill computed from what the tool answered.

"ana buys 3 pens and 2 cups" -> "26". The shop's price list (:data:`PRICES`: 48 goods at $1-$9,
fixed) is a knowledge base the environment holds: it is not in the task's text, so whoever does
a lookup must either call the shop's tool (:func:`lookup_tool`, a Python specialist) or have
learnt the prices, as a generalist answering in one step must. The rule plan is
``parse > lookup > cost > cost > sum`` (one ``cost`` per good; one good: no ``sum``):

- ``parse``:  "parse: ana buys 3 pens and 2 cups" -> "3 pens 2 cups"
- ``lookup``: "lookup: pens cups" -> "pens 4 cups 7" (the goods the parse step read)
- ``cost``:   "cost 3 4" -> "12" (the k-th cost step: the k-th good's quantity, from the parse
  step, and its price, from the lookup step's answer)
- ``sum``:    "sum 12 14" -> "26" (every cost step's output)

Each step is verified on what its own observation shows, so an upstream mistake is never a
downstream specialist's fault.
"""

from __future__ import annotations

import random
import re
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
PRICES: dict[str, int] = {good: _prices.randint(1, 9) for good in GOODS}  # the shop's list
NAMES = ("tom", "ana", "li", "sam", "kim", "max", "eva", "raj")

Bill = list[tuple[int, str]]  # (quantity, good)
_QUANTITY = re.compile(r"\b\d+ [a-z]+")


class ShoppingOptions(FamilyOptions):
    max_quantity: int = Field(9, ge=2, le=99, description="Largest quantity of one good (the "
                                                        "smallest is 2).")
    min_goods: int = Field(2, ge=1, le=4, description="Fewest goods in one task.")
    max_goods: int = Field(2, ge=1, le=4, description="Most goods in one task.")


def _pairs(text: str) -> list[tuple[str, str]]:
    """The words of ``text`` two by two ([] for none or an odd count)."""
    words = text.split()
    return [] if len(words) % 2 else list(zip(words[::2], words[1::2]))


def read_bill(text: str) -> Bill | None:
    """``[(3, "pens"), (2, "cups")]`` of "3 pens 2 cups"; None unless it is quantity-good pairs
    of known goods."""
    pairs = _pairs(text)
    if not pairs or not all(q.isdigit() and g in PRICES for q, g in pairs):
        return None
    return [(int(q), g) for q, g in pairs]


def read_prices(text: str) -> dict[str, int] | None:
    """``{"pens": 4, "cups": 7}`` of "pens 4 cups 7"; None unless it is good-price pairs."""
    pairs = _pairs(text)
    if not pairs or not all(p.isdigit() for _, p in pairs):
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


def _cost_inputs(ctx: StepContext) -> tuple[int, int] | None:
    """(quantity, price) of the good this cost step prices: the k-th cost step the k-th good of
    the parse step's bill, its price from the lookup step's answer."""
    bill, prices = _parsed(ctx), read_prices(ctx.output_of("lookup") or "")
    k = ctx.index("cost")
    if bill is None or prices is None or k >= len(bill) or bill[k][1] not in prices:
        return None
    return bill[k][0], prices[bill[k][1]]


def _cost_verify(ctx: StepContext, out: str) -> Verdict:
    found = _cost_inputs(ctx)
    if found is None:
        return Verdict(False, "no quantity and price: an earlier step gave no usable output")
    want = str(found[0] * found[1])
    return Verdict(out.strip() == want, f"{found[0]}*{found[1]} is {want}, not "
                                         f"{out.strip()[:8]!r}")


def _costs(ctx: StepContext) -> list[int] | None:
    """The outputs of every cost step before this one, as numbers (None if one is not)."""
    outs = [ctx.outputs.get(s.id, "").strip() for s in ctx.plan.steps[:ctx.index()]
            if s.type == "cost"]
    return [int(o) for o in outs] if outs and all(o.isdigit() for o in outs) else None


def _sum_verify(ctx: StepContext, out: str) -> Verdict:
    costs = _costs(ctx)
    if costs is None:
        return Verdict(False, "no costs: an earlier cost step gave no number")
    return Verdict(out.strip() == str(sum(costs)), f"the sum is {sum(costs)}")


PARSE = SubtaskType("parse", "the quantities and goods bought, e.g. '3 pens 2 cups'",
                    observe=lambda ctx: f"parse: {ctx.task.text}\n", verify=_parse_verify,
                    reference=lambda ctx: _bill_text(
                        [tuple(item) for item in ctx.task.data["items"]]), max_tokens=36)
LOOKUP = SubtaskType("lookup", "each good's price from the shop's list, e.g. 'pens 4 cups 7'",
                     observe=_lookup_observe, verify=_lookup_verify,
                     reference=lambda ctx: _prices_text([g for _, g in _parsed(ctx) or []]),
                     max_tokens=40)
COST = SubtaskType("cost", "one good's cost: its quantity times its looked-up price",
                   observe=lambda ctx: "cost {} {}\n".format(*(_cost_inputs(ctx) or "??")),
                   verify=_cost_verify, reference=lambda ctx: str(
                       (lambda f: f[0] * f[1] if f else 0)(_cost_inputs(ctx))), max_tokens=4)
SUM = SubtaskType("sum", "the bill: the goods' costs summed",
                  observe=lambda ctx: f"sum {' '.join(map(str, _costs(ctx) or ['?']))}\n",
                  verify=_sum_verify, reference=lambda ctx: str(sum(_costs(ctx) or [0])),
                  max_tokens=4)


@FAMILIES.register("shopping")
class Shopping(TaskFamily):
    """Shopping bills over the shop's price list (see the module docstring)."""

    subtask_types = (PARSE, LOOKUP, COST, SUM)
    options_model = ShoppingOptions
    whole_tokens = 4  # the bill: at most 4 x 9 x 9 = 324

    def make_task(self, rng: random.Random, index: int) -> Task:
        opts = self.options
        goods = rng.sample(GOODS, rng.randint(opts.min_goods, max(opts.min_goods,
                                                                  opts.max_goods)))
        bill = [(rng.randint(2, opts.max_quantity), g) for g in goods]
        said = [f"{q} {g}" for q, g in bill]
        listed = said[0] if len(said) == 1 else f"{', '.join(said[:-1])} and {said[-1]}"
        data = {"items": [list(item) for item in bill],
                "total": sum(q * PRICES[g] for q, g in bill)}
        return Task(f"shopping/{index}", f"{rng.choice(NAMES)} buys {listed}", data)

    def rule_plan(self, task: Task) -> Plan:
        goods = len(_QUANTITY.findall(task.text))  # "buys 3 pens, 2 cups and 4 maps": 3
        return Plan.chain(["parse", "lookup", *["cost"] * goods, *["sum"] * (goods > 1)])

    def verify(self, task: Task, answer: str) -> Verdict:
        want = str(task.data["total"])
        return Verdict(answer.strip() == want, f"expected {want}, got {answer.strip()[:8]!r}")
