"""Loading a run config: YAML read strictly, ``--set`` overrides merged, the model validated.

A bad value produces one :class:`~agentrt.core.errors.ConfigError` line naming the field and what
is allowed (:func:`agentrt.core.schema.format_validation_error`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from agentrt.core.errors import ConfigError
from agentrt.core.schema import format_validation_error


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """['policy.optim.lr=1e-3', 'train.steps=5'] -> nested dict (values parsed as YAML).

    A number picks an element of a list section: ``policies.0.optim.lr=3e-4``."""
    out: dict[str, Any] = {}
    for item in overrides:
        key, eq, raw = item.partition("=")
        parts = key.strip().split(".")
        if not eq or not all(parts):
            raise ConfigError(f"override {item!r} must look like section.field=value")
        node = out
        for depth, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parts[:depth + 1])} is set to "
                                  "a value by another --set; give one of the two")
        node[parts[-1]] = _yaml(raw, f"override {item!r}")
    return out

def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        elif isinstance(value, dict) and isinstance(merged.get(key), list):
            merged[key] = _merge_list(key, merged[key], value)
        else:
            merged[key] = value
    return merged

def _merge_list(name: str, base: list[Any], extra: dict[str, Any]) -> list[Any]:
    items = list(base)
    for index, value in extra.items():
        if not str(index).isdecimal() or int(index) >= len(items):
            raise ConfigError(f"override {name}.{index}: {name} is a list of {len(items)}; use "
                              f"an index 0-{len(items) - 1}")
        old = items[int(index)]
        items[int(index)] = (_merge(old, value) if isinstance(old, dict) and isinstance(value, dict)
                             else value)
    return items


def load_config(path: str | Path, overrides: list[str] | None, model: type[BaseModel]) -> Any:
    """Reads YAML, applies ``a.b=c`` overrides and validates. Raises ConfigError on any problem."""
    return validate_config(read_config(path, overrides), model)


def read_config(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """The YAML mapping at ``path`` with ``a.b=c`` overrides merged in (not validated yet)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not a config file; give a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a UTF-8 text file; give a YAML config") from None
    data = _yaml(text, str(path))
    if data is None:
        raise ConfigError(f"{path} is empty; write the config's sections in it (see examples/)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return apply_overrides(data, overrides or [])


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A raw config with ``a.b=c`` overrides merged in (``data`` itself left unchanged)."""
    return _merge(data, parse_overrides(overrides))

class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error (YAML says keys are
    unique; PyYAML lets the last one win, silently dropping the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *anchor' may override keys
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                continue  # an unhashable key: the safe loader's own error follows
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (also at line {seen[key]}); keep one",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)

def _yaml(text: str, where: str) -> Any:
    """``text`` parsed as YAML by the strict loader; ConfigError naming ``where`` and the line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML{at}: {problem}") from None


def validate_config(data: dict[str, Any], model: type[BaseModel]) -> Any:
    """``data`` validated as ``model``; ConfigError naming every bad field in one line."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {format_validation_error(exc)}") from None


def dump_config(cfg: BaseModel) -> str:
    """The resolved config as YAML, fields in their model's order."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
