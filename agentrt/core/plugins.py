"""Plugins: user modules that register envs, rewards, tasks and scripted players before a config
is validated, so a YAML file can name them.

Three ways to load one, all before validation:

- ``imports: [my_pkg, my_pkg.rewards]`` at the top of any config (train, tournament, decompose);
  the config file's folder is searched after ``sys.path``, so a package beside the YAML works
  without installing it;
- ``--import my_pkg`` on the command line (any number of times);
- an installed distribution that declares the entry-point group ``agentrt.core.plugins``
  (``[project.entry-points."agentrt.core.plugins"] nim = "nim_plugin"``): loaded by every command.

A module registers what it brings when imported: ``agentrt.envs.register("Nim-v0", Nim,
multi_agent=True)``, ``@agentrt.rewards.reward("name")``, ``@agentrt.envs.tasks.TASKS.register("name")``,
``agentrt.policies.scripted.SCRIPTED.add("name", Class)``. Without registering, a config may still
name a class or function as ``package.module:attr`` (env ids, baseline kinds, rewards).
See examples/plugin_pkg.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Sequence

from agentrt.core.errors import ConfigError

GROUP = "agentrt.core.plugins"
_loaded_entry_points: set[str] = set()


def load_plugins(modules: Sequence[str] = (), search: str | Path | Sequence[str] | None = None,
                 field: str = "imports") -> list[str]:
    """Imports the ``agentrt.core.plugins`` entry points (once per process), then ``modules``.

    Args:
        modules: Module names, e.g. from a config's ``imports:`` and ``--import``.
        search: Folders appended to ``sys.path`` first (the config file's, and those a run's
            saved config recorded: ``import_paths``).
        field: Named in errors.

    Returns:
        The modules imported, entry points included.

    Raises:
        ConfigError: a module cannot be imported (the message names it and why).
    """
    done = _load_entry_points()
    folders = [search] if isinstance(search, (str, Path)) else list(search or ())
    for folder in folders if modules else ():
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
    for name in modules:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{field}: {name!r} is not a module name; write e.g. "
                              "imports: [my_pkg.envs]")
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - user code may raise anything on import
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ConfigError(f"{field}: cannot import {name!r} ({type(exc).__name__}: {first}); "
                              "install it or put its folder on PYTHONPATH") from None
        done.append(name)
    return done


def _load_entry_points() -> list[str]:
    done = []
    for point in entry_points(group=GROUP):
        if point.value in _loaded_entry_points:
            continue
        try:
            point.load()
        except Exception as exc:  # noqa: BLE001 - a broken installed plugin
            raise ConfigError(f"plugin {point.name!r} (entry point {point.value!r} of "
                              f"{GROUP!r}) cannot be loaded ({type(exc).__name__}: {exc}); "
                              "reinstall or uninstall it") from None
        _loaded_entry_points.add(point.value)
        done.append(point.value)
    return done


def import_paths(data: dict[str, Any]) -> list[str]:
    """The ``import_paths:`` list of a raw config (folders its ``imports:`` were found in)."""
    value = data.get("import_paths") or []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"import_paths: must be a list of folders (got {value!r})")
    return value


def config_imports(data: dict[str, Any]) -> list[str]:
    """The ``imports:`` list of a raw config (a string is one module)."""
    value = data.get("imports") or []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ConfigError(f"imports: must be a list of module names (got {value!r})")
    return value
