"""The config kinds and the checks every command runs before it starts any work.

``agentrt check-config`` and ``agentrt train | tournament run | tournament eval | decompose run``
all load their config through :func:`load_checked`: it tells the kind from the config's sections
(or takes ``--kind``), validates the pydantic model of that kind and then resolves what the model
alone cannot (a reward given by name or ``module:function``, model folders, tool functions), so
a bad config fails with one :class:`ConfigError` line before a run folder exists. Nothing here
imports torch, transformers, Ray or matplotlib: an invalid config fails in well under two seconds.
"""

from __future__ import annotations


import functools
import importlib
import re
import types
import typing
from pathlib import Path
from typing import Any, Sequence

from pydantic import BaseModel, Field, create_model

from agentrt.config.context import check_contexts
from agentrt.config.load import read_config, validate_config
from agentrt.config.sections import Section
from agentrt.core.compiler import require_compiler
from agentrt.core.errors import ConfigError
from agentrt.core.plugins import config_imports, import_paths, load_plugins
from agentrt.core.registry import import_callable

# kind -> (config model as "module:class", sections only that kind has, workload as "module:class")
KINDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "train": ("agentrt.workloads.prompts.config:TrainConfig", ("task", "reward", "policy", "data"),
              "agentrt.workloads.prompts.workload:PromptWorkload"),
    "tournament": ("agentrt.tournaments.run_config:TournamentRunConfig",
                   ("envs", "baselines", "schedule", "warm_start", "runner", "memory"),
                   "agentrt.tournaments.trainer:LeagueWorkload"),
    "decompose": ("agentrt.decomposer.config:DecomposeConfig",
                  ("family", "planner", "tools", "router", "chain"),
                  "agentrt.decomposer.workload:DecomposeWorkload"),
}


def launch(kind: str, cfg: Any, start: str = "auto") -> Any:
    """The one launch of every run command: a :class:`~agentrt.controller.launch.Run` of the
    kind's workload over ``cfg`` (imports torch; call after the config is checked)."""
    from agentrt.controller.launch import Run

    return Run(cfg, import_callable(KINDS[kind][2], "kind"), start)


@functools.cache
def config_model(kind: str) -> type[Section]:
    """The pydantic model of a config kind ('train', 'tournament' or 'decompose'), with the
    ``imports:`` field every kind has (see agentrt.core.plugins)."""
    if kind not in KINDS:
        raise ConfigError(f"--kind {kind!r} is not a config kind; valid: {', '.join(KINDS)}")
    module, _, name = KINDS[kind][0].partition(":")
    base = getattr(importlib.import_module(module), name)
    return create_model(name, __base__=base, __module__=base.__module__, imports=(
        tuple[str, ...], Field((), description="Modules imported before the config is checked "
                                               "(user envs, rewards, tasks, scripted players).")),
        import_paths=(tuple[str, ...], Field((), description="Folders the imports are found "
                                             "in besides the installed packages (the config "
                                             "file's folder is added and saved with the run).")))


def detect_kind(data: dict[str, Any], path: str | Path = "config",
                default: str | None = None) -> str:
    """The kind whose own sections the config has (``envs:`` -> tournament, ``family:`` ->
    decompose, ``task:``/``policy:`` -> train); a config with none is of kind ``default``
    (None: train, unless it has ``policies:``).

    Raises:
        ConfigError: sections of two kinds at once (pass ``--kind``).
    """
    found = {kind: [s for s in sections if s in data] for kind, (_, sections, _) in KINDS.items()}
    kinds = [k for k, sections in found.items() if sections]
    if len(kinds) > 1:
        shown = "; ".join(f"{k} ({', '.join(found[k])})" for k in kinds)
        raise ConfigError(f"{path}: has sections of several config kinds: {shown}; remove the "
                          f"ones that do not belong, or pass --kind {'|'.join(KINDS)}")
    if not kinds and default is not None:
        return default
    if not kinds and "policies" in data:
        raise ConfigError(f"{path}: a config with policies: is a tournament (add envs:) or a "
                          "decomposer config (add family:); or pass --kind")
    return kinds[0] if kinds else "train"


def load_checked(path: str | Path, overrides: Sequence[str] | None = None,
                 kind: str | None = None, expect: str | None = None,
                 imports: Sequence[str] = ()) -> tuple[str, Any]:
    """Reads, validates and resolves a config of any kind.

    Args:
        path: YAML file.
        overrides: ``section.field=value`` strings merged in first.
        kind: The config kind; None tells it from the sections.
        expect: The kind a command runs (e.g. 'tournament'): another kind is an error that
            names the command to use instead.
        imports: Plugin modules to import (``--import``), besides the config's ``imports:``.

    Returns:
        ``(kind, config)``.

    Raises:
        ConfigError: one line naming the field and the fix.
    """
    data = read_config(path, list(overrides or []))
    modules = [*imports, *config_imports(data)]
    # the config's folder, and those a run's saved config recorded (play, eval, resume from
    # the run folder find the plugins where the run found them)
    paths = list(dict.fromkeys([*import_paths(data), str(Path(path).resolve().parent)]))
    load_plugins(modules, search=paths)
    if modules:
        data = {**data, "imports": modules, "import_paths": paths}
    kind = kind or detect_kind(data, path, default=expect)
    if expect is not None and kind != expect:
        command = {"train": "agentrt train", "tournament": "agentrt tournament run",
                   "decompose": "agentrt decompose run"}[kind]
        raise ConfigError(f"{path} is a {kind} config, not a {expect} config; run it with "
                          f"`{command}`")
    cfg = validate_config(data, config_model(kind))
    resolve(kind, cfg)
    return kind, cfg


def resolve(kind: str, cfg: Any) -> None:
    """Checks what a config's model cannot: rewards, model folders, tool functions, a C++
    compiler for ``compile: true``.

    Raises:
        ConfigError: "<field>: <what is wrong>; <how to fix it>".
    """
    if kind == "train":
        from agentrt.workloads.prompts.data import check_source
        from agentrt.rewards.sources import check_reward

        check_reward(cfg.reward)  # functions import, model folders classify, services answer
        check_model_path("policy.model.path", cfg.policy.model.path)
        if cfg.policy.compile:
            require_compiler("policy.compile")
        check_contexts(cfg)
        check_source(cfg.task)  # a data file's mapped columns
        return
    for i, policy in enumerate(cfg.policies):
        check_model_path(f"policies.{i}.model.path", policy.model.path)
        if policy.compile:
            require_compiler(f"policies.{i}.compile")
    check_contexts(cfg)
    for i, tool in enumerate(getattr(cfg, "tools", ())):
        import_callable(tool.fn, f"tools.{i}.fn")


def check_model_path(field: str, path: str | None) -> None:
    """A ``model.path`` must be a local Hugging Face model (or PEFT adapter) folder."""
    if path is None:
        return
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"{field}: folder {path!r} does not exist; give a local Hugging Face "
                          "model folder, or use model.preset")
    if not any((folder / name).is_file() for name in ("config.json", "adapter_config.json")):
        raise ConfigError(f"{field}: {path!r} has no config.json (nor adapter_config.json); it "
                          "is not a Hugging Face model folder")


def describe_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """``(path, type, default, description)`` of every field of a config model, depth first;
    a nested section is listed with its fields under ``section.``. ``agentrt config-help``."""
    rows: list[tuple[str, str, str, str]] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        section = _section(field.annotation)
        doc = field.description or ""
        entry = _entries(field.annotation)
        if section is not None or entry is not None:  # a section, or a list of them
            inner = section or entry
            doc = doc or (inner.__doc__ or "").strip().split("\n")[0]
            rows.append((path, "section" if section else "list", "", doc))
            rows.extend(describe_fields(inner, f"{path}." if section else f"{path}[]."))
            continue
        default = "required" if field.is_required() else repr(
            field.get_default(call_default_factory=True))
        rows.append((path, _type_name(field.annotation), default, doc))
    return rows


def _section(annotation: Any) -> type[BaseModel] | None:
    """The model of a field that is a section (``X`` or ``X | None``), else None."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] \
        if typing.get_origin(annotation) in (typing.Union, types.UnionType) else [annotation]
    if len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0]
    return None


def help_rows(kind: str, field: str | None) -> list[tuple[str, str, str, str]]:
    """``agentrt config-help``'s rows: :func:`describe_fields` of ``kind``, those of ``field``
    and under it only when given (an entry's index names every entry: ``envs.0.template`` is
    ``envs[].template``)."""
    if kind not in KINDS:
        raise ConfigError(f"{kind!r} is not a config kind; valid: {', '.join(KINDS)}")
    if field is not None:
        field = re.sub(r"\.\d+(?=\.|$)", "[]", field)
    rows = [r for r in describe_fields(config_model(kind)) if field is None or r[0] == field
            or r[0].startswith(f"{field}.") or r[0].startswith(f"{field}[].")]
    if not rows:
        raise ConfigError(f"{kind} configs have no field {field!r}; `agentrt config-help "
                          f"{kind}` lists them")
    return rows


def _entries(annotation: Any) -> type[BaseModel] | None:
    """The model of each entry of a field that is a list (or tuple) of sections, else None."""
    if typing.get_origin(annotation) not in (list, tuple):
        return None
    args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
    return args[0] if len(args) == 1 and _section(args[0]) is not None else None


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    text = re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", str(annotation)).replace("NoneType", "None")
    return re.sub(r"Annotated\[(\w+), [^\]]*\]", r"\1", text)
