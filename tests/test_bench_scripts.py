"""Every script in bench/ imports and parses its arguments (``--help``), and every helper module
there imports, all in one process: a renamed module, function or option breaks here rather than
the next time someone measures. (The benches that run at toy size in CI have their own tests:
tests/test_bench_decomposer.py, tests/tournaments/test_exploitability.py and others.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"

# Runs each file of bench/ in one interpreter (the imports are shared, so it takes seconds): a
# script (it has a __main__ block) with --help, a helper module (imported by a script) as is.
DRIVER = r"""
import contextlib, io, json, runpy, sys
from pathlib import Path

bench = Path(sys.argv[1])
sys.path.insert(0, str(bench))  # as when a script runs: its folder first (helpers import so)
result = {}
for path in sorted(bench.glob("*.py")):
    script = 'if __name__ == "__main__":' in path.read_text()
    sys.argv = [str(path), "--help"] if script else [str(path), "-"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(path), run_name="__main__" if script else path.stem)
        result[path.name] = "imported" if not script else "ran without parsing --help"
    except SystemExit as e:
        ok = e.code in (0, None) and out.getvalue().startswith("usage:")
        result[path.name] = "help" if ok else f"exit {e.code}: {out.getvalue()[:300]}"
    except BaseException as e:
        result[path.name] = f"{type(e).__name__}: {e}"[:500]
print(json.dumps(result))
"""


def test_every_bench_script_imports_and_parses_its_arguments() -> None:
    out = subprocess.run([sys.executable, "-c", DRIVER, str(BENCH)], capture_output=True,
                         text=True, timeout=600, cwd=BENCH.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(result) == {p.name for p in BENCH.glob("*.py")}
    helpers = {"oldcode.py", "rollout_arch.py", "vs_trl_parity.py"}  # imported by scripts
    assert {k for k, v in result.items() if v == "imported"} == helpers
    broken = {k: v for k, v in result.items() if v not in ("help", "imported")}
    assert not broken, broken
