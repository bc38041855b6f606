"""The wheel holds every subpackage: setuptools installs only the packages pyproject lists, and an
editable install (the tests') finds unlisted ones anyway, so nothing else would notice one left out.
"""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    dirs = {"agentrt": "agentrt"} | tool["package-dir"]
    found = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found - listed == set(), "subpackages missing from [tool.setuptools] packages"
    assert listed - found == set(), "listed packages without a folder"
