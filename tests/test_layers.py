"""The layer contract of pyproject.toml (``[tool.importlinter]``) holds, and no modules import
each other in a cycle.

Both checks read a plain (not editable) install of this checkout: there the package-dir mapping
is a real tree (``agentrt.envs`` in ``agentrt/envs/`` ...), which is what grimp walks. Imports
inside functions count; imports under ``if TYPE_CHECKING:`` do not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"

# Prints the module import graph of the installed agentrt as JSON {module: [imported modules]}.
GRAPH = """
import json, grimp
g = grimp.build_graph("agentrt", exclude_type_checking_imports=True, cache_dir=None)
print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout installed with ``pip install --target`` (copied first, so no build folder
    is left in the checkout and no stale one is read)."""
    tmp = tmp_path_factory.mktemp("layers")
    src = tmp / "src"
    src.mkdir()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = {"agentrt", *config["tool"]["setuptools"]["package-dir"].values()}
    for name in sorted(folders):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(tmp / "site"), str(src)],
                   check=True, capture_output=True)
    return tmp / "site"


def on_path(installed: Path) -> dict[str, str]:
    """The environment with only the installed tree on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": str(installed)}


def lint(installed: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with ``config`` on the installed tree (run from its folder)."""
    return subprocess.run([str(LINT), "--no-cache", str(config)], cwd=installed.parent,
                          capture_output=True, text=True, env=on_path(installed))


def test_layer_contract_holds(installed: Path) -> None:
    out = lint(installed, ROOT / "pyproject.toml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize("edit", [
    ('    "runner",\n', ""),  # a subpackage in no layer: the contract is exhaustive
    ('    "controller",\n    "runner",\n', '    "runner",\n    "controller",\n'),  # upward
])
def test_contract_is_live(installed: Path, edit: tuple[str, str]) -> None:
    """The contract fails when one layer line is removed or two layers change places."""
    text = (ROOT / "pyproject.toml").read_text()
    assert edit[0] in text
    config = installed.parent / "edited" / "pyproject.toml"
    config.parent.mkdir(exist_ok=True)
    config.write_text(text.replace(edit[0], edit[1]))
    out = lint(installed, config)
    assert out.returncode != 0, out.stdout
    assert "BROKEN" in out.stdout and "agentrt.runner" in out.stdout, out.stdout


def strongly_connected(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_strongly_connected_finds_a_cycle() -> None:
    graph = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["e"]}
    assert strongly_connected(graph) == [["a", "b", "c"]]


def test_no_import_cycles(installed: Path) -> None:
    """No module imports itself through others (a package ``__init__`` is a module too)."""
    out = subprocess.run([sys.executable, "-c", GRAPH], cwd=installed.parent, capture_output=True,
                         text=True, env=on_path(installed), check=True)
    graph = json.loads(out.stdout)
    assert "agentrt.envs.board" in graph  # the installed tree, side folders included
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)
