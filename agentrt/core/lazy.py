"""Lazy package exports: a package's public names load their submodule on first use.

A package ``__init__`` that imported every submodule eagerly would make ``import
agentrt.tournaments.run_config`` load matplotlib, and ``agentrt.policies`` load torch and
transformers, before a config is even validated. With this helper (the pattern of PEP 562 and
scientific-python's SPEC 1) ``from agentrt.policies import LMPolicy`` still works, but importing
a light submodule (``agentrt.policies.presets``) costs only that submodule.

Example, in a package's ``__init__.py``::

    __getattr__, __dir__, __all__ = lazy_exports(__name__, globals(), {
        "agentrt.policies.lm": ("LMPolicy", "PromptTemplate"),
    })
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping, Sequence


def lazy_exports(package: str, namespace: dict[str, Any],
                 exports: Mapping[str, Sequence[str]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """Module-level ``__getattr__``, ``__dir__`` and ``__all__`` for ``package``.

    Args:
        package: The package's ``__name__``.
        namespace: The package's ``globals()``; a loaded name is cached there, so the
            submodule is looked up once.
        exports: Submodule -> the public names it defines.
    """
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__, sorted(where)
