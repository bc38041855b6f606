"""Python specialists (``tools: [{fn: "decompose_tools:..."}]``) for the decomposer run tests.

Importable from the tests (pytest puts this folder on ``sys.path``) and from an ``agentrt
decompose run`` subprocess with this folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import re
from typing import Any

from agentrt.decomposer.families.wordchain import ITEMS, OPS


def _task_line(req: Any) -> list[str]:
    """The words of the step's own line (a repair prepends 'previous try failed: ...')."""
    return req.observation.strip().splitlines()[-1].split()


def formatted(words: list[str]) -> str:
    """The format step's answer from its words ("format 16: tom has 3 bags of 7 pens ..." ->
    "16 pens"): the value, and the item the problem's words name."""
    item = next((w.strip(",") for w in words[2:] if w.strip(",") in ITEMS), "?")
    return f"{words[1].rstrip(':')} {item}"


def calc(req: Any) -> str:
    """Always right on word-chain parse, arithmetic and format steps."""
    words = _task_line(req)
    if words[0] == "parse:":
        return " ".join(re.findall(r"\d+", " ".join(words[1:])))
    if words[0] == "format":
        return formatted(words)
    if "?" in words:
        return "0"
    return str(OPS[words[0]](int(words[1]), int(words[2])))


def odd_format(req: Any) -> str:
    """A formatter with a bug: it raises on an odd number, else formats right."""
    words = _task_line(req)
    if int(words[1].rstrip(":")) % 2:
        raise ValueError(f"cannot format odd {words[1].rstrip(':')}")
    return formatted(words)
