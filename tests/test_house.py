"""The shape of the house (docs/architecture.md): layer folders, small modules, direct imports.

- ``agentrt/`` holds only its layer folders, ``cli.py`` and ``__init__.py``;
- no library module over 500 lines, no function over 60, no class over 300;
- every ``from agentrt.X import name`` (library, tests, benches, examples) names the module that
  defines ``name``, never a module that only imports it from elsewhere (a re-export). A package
  ``__init__`` that *defines* a name (``agentrt.memory.open_bank``) may be imported from; the
  user-facing facades of ``agentrt.envs``, ``agentrt.policies`` ... still work for users, but
  nothing in this repository leans on them.

The import graph itself (layers, cycles) is checked by tests/test_layers.py.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"]
LIBRARY = sorted({ROOT / d for d in PACKAGE_DIRS.values()})
LIMITS = {"module": 500, "function": 60, "class": 300}


def module_path(module: str) -> Path | None:
    """The source file of ``module`` under the package-dir mapping (None: not ours)."""
    top = max((p for p in PACKAGE_DIRS if module == p or module.startswith(p + ".")),
              key=len, default=None)
    if top is None:
        return None
    base = ROOT / PACKAGE_DIRS[top] / Path(*module[len(top):].lstrip(".").split(".")) \
        if module != top else ROOT / PACKAGE_DIRS[top]
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def bindings(path: Path) -> dict[str, str | None]:
    """Top-level names of a module: None when defined there, else the module it imports from."""
    out: dict[str, str | None] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out[node.name] = None
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                out.update({n.id: None for t in targets for n in ast.walk(t)
                            if isinstance(n, ast.Name)})
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                out.update({a.asname or a.name: node.module for a in node.names
                            if out.get(a.asname or a.name, "") is not None})
            elif isinstance(node, ast.Try):
                visit(node.body)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body)
                visit(node.orelse)

    tree = ast.parse(path.read_text())
    visit(tree.body)
    for node in ast.walk(tree):  # agentrt.core.lazy.lazy_exports(name, globals(), {module: names})
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "lazy_exports":
            for module, names in ast.literal_eval(node.args[2]).items():
                out |= {name: module for name in names if name not in out}
    return out


def python_files(*folders: Path) -> list[Path]:
    return sorted(p for f in folders for p in f.rglob("*.py") if "__pycache__" not in p.parts)


def test_agentrt_holds_only_layer_folders_and_the_cli():
    loose = sorted(p.name for p in (ROOT / "agentrt").glob("*.py"))
    assert loose == ["__init__.py", "cli.py"]


def test_no_module_function_or_class_is_too_long():
    too_long = []
    for path in python_files(*LIBRARY):
        source = path.read_text()
        rel = path.relative_to(ROOT)
        if source.count("\n") > LIMITS["module"]:
            too_long.append(f"{rel}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            kind = ("class" if isinstance(node, ast.ClassDef) else "function"
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
            if kind and node.end_lineno - node.lineno + 1 > LIMITS[kind]:
                too_long.append(f"{rel}:{node.lineno} {kind} {node.name}: "
                                f"{node.end_lineno - node.lineno + 1} lines")
    assert not too_long, "over the house limits (module 500, function 60, class 300):\n" + \
        "\n".join(too_long)


@pytest.mark.parametrize("folder", ["library", "tests", "bench", "examples"])
def test_every_import_names_the_defining_module(folder):
    folders = LIBRARY if folder == "library" else [ROOT / folder]
    found = []
    for path in python_files(*folders):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and not node.level):
                continue
            source = module_path(node.module)
            if source is None:
                continue
            names = bindings(source)
            for alias in node.names:
                origin = names.get(alias.name)
                if origin is not None and module_path(origin) is not None and \
                        module_path(f"{node.module}.{alias.name}") is None:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name} from "
                                 f"{node.module} (defined in {origin})")
    assert not found, "imports through a re-export; name the defining module:\n" + \
        "\n".join(found)
