"""The base of every config model: frozen, unknown keys refused, no NaN or infinity, and no
silent casts between booleans and numbers.

pydantic's lax mode turns ``steps: true`` into 1 step and ``progress: 1`` into True; a YAML typo
of that kind must be an error naming the field instead. Strict mode as a whole would refuse too
much (a string for a ``Path``, an int for a float, ``lr: 1e-3``, which YAML 1.1 reads as a
string), so only the bool/number casts are refused, by one validator shared by every model.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

_NUMBERS = (int, float)

# Bounds of sizes and seeds: past them a run would hang building its data or its first step, or
# fail deep inside numpy (whose seeds are 32-bit), instead of being refused by name.
MAX_SEED = 2**32 - 1
MAX_TASKS = 1_000_000  # prompts or tasks generated from a seed (held in memory)
MAX_EVAL = 100_000  # held-out prompts or tasks, played at every evaluation
MAX_PER_STEP = 65_536  # prompts, tasks or games of one step
MAX_GROUP = 4_096  # samples per prompt or task


class ConfigModel(BaseModel):
    """A config section: subclass it instead of ``BaseModel`` (agentrt.config.sections.Section does)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_number_casts(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None:
            return value
        accepts = _scalar_types(field.annotation)
        items = _item_types(field.annotation)
        if isinstance(value, (list, tuple)) and items:
            for item in value:
                _check(item, items)
        elif accepts:
            _check(value, accepts)
        return value


def _check(value: Any, accepts: frozenset[type]) -> None:
    if isinstance(value, bool) and bool not in accepts and accepts & set(_NUMBERS):
        raise ValueError(f"expected a number, not the boolean {str(value).lower()}")
    if (isinstance(value, _NUMBERS) and not isinstance(value, bool) and accepts == {bool}):
        raise ValueError(f"expected true or false, not the number {value}")


@functools.cache
def _scalar_types(annotation: Any) -> frozenset[type]:
    """The plain types ``annotation`` accepts (unions and Optional unwrapped); empty when it
    accepts anything else too (Any, a model, a container), so no check applies."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _scalar_types(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        found: set[type] = set()
        for arg in typing.get_args(annotation):
            if arg is type(None):
                continue
            inner = _scalar_types(arg)
            if not inner:
                return frozenset()
            found |= inner
        return frozenset(found)
    return frozenset({annotation}) if annotation in (bool, *_NUMBERS) else frozenset()


@functools.cache
def _item_types(annotation: Any) -> frozenset[type]:
    """The scalar types of a ``list[float]`` or ``tuple[float, float]``'s items (else empty)."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _item_types(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) not in (list, tuple):
        return frozenset()
    args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
    kinds = {_scalar_types(a) for a in args}
    return next(iter(kinds)) if len(kinds) == 1 else frozenset()


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """One line per problem: 'policy.optim.lr: Input should be greater than 0 (got -1)'.

    ``prefix`` goes before each location (a list item validated on its own: 'reward.0.')."""
    lines = []
    errors = err.errors()
    for e in errors:
        if e["type"] == "too_short" and any(  # a list short only because an item failed
                len(o["loc"]) > len(e["loc"]) and o["loc"][:len(e["loc"])] == e["loc"]
                for o in errors):
            continue
        loc = prefix + ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        shown = "" if isinstance(got, dict) or e["type"] == "missing" else f" (got {got!r})"
        if loc and msg.startswith(f"{loc}."):  # the message names a place inside the field
            loc, shown = "", ""
        # A check across fields (no location) names its fields in its own message.
        lines.append(f"{loc}: {msg}{shown}" if loc else f"{msg}{shown}")
    return "; ".join(lines)
