"""An earlier commit of agentrt beside this checkout, for benches that measure before and after.

:func:`export` installs the commit (``git archive``, then a plain ``pip install -t``: not
editable) into a folder; :func:`run_arm` runs a script in a fresh Python process on either code
base. The script sees the code folder as ``sys.argv[1]`` (``-``: this checkout) and its own
arguments after it; its last stdout line is one JSON object, the arm's result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Puts the old code first on the path and drops the editable install's finder, so
# ``import agentrt`` (and its subpackages) resolves to the exported commit.
PRELUDE = r"""
import sys
if sys.argv[1] != "-":
    sys.path.insert(0, sys.argv[1])
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
"""


def export(commit: str, dest: Path) -> Path:
    """``commit`` installed (not editable) into ``dest``; returns the import root."""
    src = dest / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    target = dest / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "-t", str(target), str(src)], check=True,
                   capture_output=True)
    return target


def run_arm(script: str, code: str, args: list[str], name: str) -> dict:
    """Runs ``script`` on ``code`` (an :func:`export` folder or ``-``) in a fresh process;
    returns the JSON object of its last stdout line."""
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, "-c", PRELUDE + script, code, *args],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"arm {name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
