"""Prompt data for ``agentrt train``: built-in tasks, files and streams behind one source seam.

``task.name`` picks the source: a built-in task generator (:data:`agentrt.envs.tasks.TASKS`) or a
registered prompt source (:data:`PROMPT_SOURCES`: ``dataset`` for JSONL/Parquet/datasets files,
``redis`` for a Redis stream), each with its own options model. See docs/data.md.

Importing this package is cheap (no pyarrow, datasets or redis until a source opens).
"""

from __future__ import annotations

from typing import Any

from agentrt.core.registry import Registry

#: name -> source class (``options_model``, ``__init__(task_config, seed)``); lazily imported.
PROMPT_SOURCES: Registry[type] = Registry("prompt source")
PROMPT_SOURCES.add_lazy("dataset", "agentrt.workloads.prompts.data.sources:FileSource")
PROMPT_SOURCES.add_lazy("redis", "agentrt.workloads.prompts.data.redis_stream:RedisSource")


def options_model(name: str) -> type | None:
    """The options model of the prompt source ``name`` (None: not a prompt source)."""
    return PROMPT_SOURCES.get(name).options_model if name in PROMPT_SOURCES else None


def open_source(task: Any, seed: int) -> Any:
    """The :class:`~agentrt.workloads.prompts.data.sources.PromptSource` of a ``task:`` config section."""
    from agentrt.workloads.prompts.data.sources import TaskSource

    if task.name in PROMPT_SOURCES:
        return PROMPT_SOURCES.get(task.name)(task, seed)
    return TaskSource(task, seed)


def check_source(task: Any) -> None:
    """What a source's options model alone cannot check (a file's columns), before any work.

    Raises:
        ConfigError: one line naming the field.
    """
    source = PROMPT_SOURCES.get(task.name) if task.name in PROMPT_SOURCES else None
    check = getattr(source, "check", None)
    if check is not None:
        check(source.options_model(**task.options))
