"""The house move changed no behaviour: this checkout against the last commit before it.

Issue "The house", must-show 3. Two workloads, each run by two code bases (``--old``, default
8f6810c: the last commit before the move, installed non-editable by bench/oldcode.py; and this
checkout), one after the other, each in a fresh process at ``threads=1``, through the CLI itself
(``agentrt.cli.main`` with ``sys.argv`` set, so one arm script serves old and new code):

- league: ``make demo`` (``agentrt tournament run examples/ttt_league.yaml``) at
  ``train.steps=--league-steps`` (60): warm start, PFSP league, evaluations, checkpoints.
- arith: ``agentrt train examples/arith_grpo.yaml`` at ``train.steps=--arith-steps`` (20): SFT
  warm start, then GRPO.

Each arm writes into its own temporary run folder (``--run-dir``, ``--new-run``,
``progress=false``); every other setting is the example's, seeds included. Compared:

- every metrics.jsonl row, row by row: every key both arms have whose value is a number, but the
  wall-clock ones (:func:`wall_clock`); keys only one arm has are listed, not failed;
- league only: every row of every table of matches.sqlite (by rowid), every column but the
  wall-clock ones (:data:`WALL_COLUMNS`).

Numbers match when ``math.isclose(old, new, rel_tol=1e-6, abs_tol=1e-6)``: absolute 1e-6 for
magnitudes up to 1, relative 1e-6 above. Prints a summary, writes the raw result to
bench/results/house_parity.json, exits 1 on any difference.

Run: ``.venv/bin/python bench/house_parity.py [--old COMMIT] [--league-steps 60]
[--arith-steps 20] [--only league|arith]`` (``--new COMMIT``: a commit in place of this
checkout). ``--old`` and ``--new`` the same, with ``--all-keys`` (wall-clock keys compared too),
shows which keys vary between two runs of the same code: how :func:`wall_clock` was found.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

from oldcode import ROOT, export, run_arm

ARM = r"""
import json, sys
import agentrt
from agentrt.cli import main
sys.argv = ["agentrt", "--debug", *json.loads(sys.argv[2])]
main()
print(json.dumps({"code": agentrt.__file__}))
"""

WORKLOADS = {"league": ["tournament", "run", str(ROOT / "examples" / "ttt_league.yaml")],
             "arith": ["train", str(ROOT / "examples" / "arith_grpo.yaml")]}
TOL = 1e-6
SHOWN = 20  # differences kept per workload in the result (their total count is kept too)
RESULT = ROOT / "bench" / "results" / "house_parity.json"

# Columns of matches.sqlite that hold wall-clock times: matches.time (unix seconds when recorded;
# like the metrics' ``time`` it passes the relative 1e-6, so it is named, not found).
WALL_COLUMNS = {("matches", "time")}


def wall_clock(key: str) -> bool:
    """Metric keys that measure the wall clock, so differ between two runs of the same code.

    Found with ``--old d94621b --new d94621b --all-keys`` (the moved code run twice, 60 league
    and 20 arithmetic steps): every ``timing_s/*`` (phase durations, ``timing_s/policy/<player>``
    and ``timing_s/warm_start`` included), the rates ``perf/episodes_per_s``,
    ``perf/actions_per_s``, ``perf/tokens_per_s`` and the reward's ``reward/<name>/latency_s``;
    so: keys under ``timing_s/`` or ending in ``_s`` (seconds, or per second). ``time`` (unix
    seconds of the row) is excluded by name: 1e-6 relative of 1.8e9 s is half an hour, so it
    passed. Every other key came out identical, ``perf/threads`` and token counts included.
    """
    return key == "time" or key.startswith("timing_s/") or key.endswith("_s")


def numbers(*values: object) -> bool:
    return all(isinstance(v, (int, float)) for v in values)


def same(old: object, new: object) -> bool:
    if numbers(old, new):
        if math.isnan(old) or math.isnan(new):
            return math.isnan(old) and math.isnan(new)
        return math.isclose(old, new, rel_tol=TOL, abs_tol=TOL)
    return old == new


class Tally:
    """What one workload compared, and where the two arms differ."""

    def __init__(self) -> None:
        self.counts = {"metric_rows": 0, "metric_values": 0, "table_rows": 0, "table_cells": 0}
        self.keys: set[str] = set()
        self.only = {"old": set(), "new": set()}
        self.max_abs = 0.0
        self.diffs: list[dict] = []
        self.n_diffs = 0
        self.differing: set[str] = set()  # every key (table.column) with a difference

    def check(self, where: dict, old: object, new: object) -> None:
        if numbers(old, new) and not (math.isnan(old) or math.isnan(new)):
            self.max_abs = max(self.max_abs, abs(old - new))
        if not same(old, new):
            self.differ({**where, "old": old, "new": new})

    def differ(self, diff: dict) -> None:
        self.n_diffs += 1
        self.differing.add(diff.get("key") or ".".join(
            str(diff[k]) for k in ("table", "column") if k in diff) or diff["file"])
        if len(self.diffs) < SHOWN:
            self.diffs.append(diff)

    def result(self) -> dict:
        return {**self.counts, "metric_keys": len(self.keys),
                "only_old": sorted(self.only["old"]), "only_new": sorted(self.only["new"]),
                "max_abs_diff": self.max_abs, "differences": self.n_diffs,
                "differing_keys": sorted(self.differing),
                "first_differences": self.diffs}


def compare_metrics(old_dir: Path, new_dir: Path, tally: Tally, all_keys: bool) -> None:
    rows = [[json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
            for d in (old_dir, new_dir)]
    if len(rows[0]) != len(rows[1]):
        tally.differ({"file": "metrics.jsonl", "rows": "count",
                      "old": len(rows[0]), "new": len(rows[1])})
    for index, (old, new) in enumerate(zip(*rows)):
        tally.counts["metric_rows"] += 1
        tally.only["old"] |= old.keys() - new.keys()
        tally.only["new"] |= new.keys() - old.keys()
        for key in sorted(old.keys() & new.keys()):
            if not numbers(old[key], new[key]) or (wall_clock(key) and not all_keys):
                continue
            tally.keys.add(key)
            tally.counts["metric_values"] += 1
            tally.check({"file": "metrics.jsonl", "row": index, "step": new.get("step"),
                         "key": key}, old[key], new[key])


def read_tables(path: Path) -> dict[str, tuple[list[str], list[tuple]]]:
    """Every table of a SQLite file: its column names and its rows in rowid order."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        names = [r[0] for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        out = {}
        for name in names:
            cursor = db.execute(f'SELECT * FROM "{name}" ORDER BY rowid')
            out[name] = ([c[0] for c in cursor.description], cursor.fetchall())
    return out


def compare_tables(old_dir: Path, new_dir: Path, tally: Tally, all_keys: bool) -> None:
    old, new = (read_tables(d / "matches.sqlite") for d in (old_dir, new_dir))
    for name in sorted(old.keys() | new.keys()):
        if name not in old or name not in new:
            tally.differ({"file": "matches.sqlite", "table": name,
                          "old": name in old, "new": name in new})
            continue
        (old_cols, old_rows), (new_cols, new_rows) = old[name], new[name]
        tally.only["old"] |= {f"{name}.{c}" for c in set(old_cols) - set(new_cols)}
        tally.only["new"] |= {f"{name}.{c}" for c in set(new_cols) - set(old_cols)}
        cols = [c for c in old_cols if c in new_cols
                and (all_keys or (name, c) not in WALL_COLUMNS)]
        if len(old_rows) != len(new_rows):
            tally.differ({"file": "matches.sqlite", "table": name, "rows": "count",
                          "old": len(old_rows), "new": len(new_rows)})
        for index, (a, b) in enumerate(zip(old_rows, new_rows)):
            tally.counts["table_rows"] += 1
            for col in cols:
                tally.counts["table_cells"] += 1
                tally.check({"file": "matches.sqlite", "table": name, "row": index,
                             "column": col}, a[old_cols.index(col)], b[new_cols.index(col)])


def run(workload: str, steps: int, code: str, run_dir: Path, name: str) -> dict:
    args = [*WORKLOADS[workload], "--run-dir", str(run_dir), "--new-run",
            "--set", "threads=1", "--set", "progress=false", "--set", f"train.steps={steps}"]
    start = time.perf_counter()
    res = run_arm(ARM, code, [json.dumps(args)], name)
    res["seconds"] = round(time.perf_counter() - start, 1)
    print(f"  {name:<14} {res['seconds']:7.1f} s  ({res['code']})", flush=True)
    return res


def workload_parity(workload: str, steps: int, codes: dict[str, str], tmp: Path,
                    all_keys: bool) -> dict:
    dirs = {arm: tmp / f"{workload}_{arm}" for arm in codes}
    arms = {arm: run(workload, steps, code, dirs[arm], f"{workload} {arm}")
            for arm, code in codes.items()}
    tally = Tally()
    compare_metrics(dirs["old"], dirs["new"], tally, all_keys)
    if workload == "league":
        compare_tables(dirs["old"], dirs["new"], tally, all_keys)
    return {"steps": steps, "arms": arms, **tally.result()}


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def commit(ref: str) -> dict:
    """The commit an arm runs; for this checkout HEAD at the start, and whether the tree had
    uncommitted changes to tracked files then."""
    if ref == "-":
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return {"commit": git("rev-parse", "HEAD"), "uncommitted_changes": bool(dirty)}
    return {"commit": git("rev-parse", f"{ref}^{{commit}}")}


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor(),
            "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "loadavg": os.getloadavg()}


def report(results: dict) -> None:
    print(f"\n{'workload':<8} {'steps':>5} {'rows':>5} {'values':>8} {'keys':>5} "
          f"{'sql rows':>8} {'cells':>8} {'max |diff|':>11} {'diffs':>6}")
    for workload, r in results.items():
        print(f"{workload:<8} {r['steps']:5d} {r['metric_rows']:5d} {r['metric_values']:8d} "
              f"{r['metric_keys']:5d} {r['table_rows']:8d} {r['table_cells']:8d} "
              f"{r['max_abs_diff']:11.3g} {r['differences']:6d}")
    for workload, r in results.items():
        for side in ("old", "new"):
            if r[f"only_{side}"]:
                print(f"{workload}: only {side}: {', '.join(r[f'only_{side}'])}")
        if r["differing_keys"]:
            print(f"{workload}: differing keys: {', '.join(r['differing_keys'])}")
        for diff in r["first_differences"][:10]:
            print(f"{workload}: DIFFERS {json.dumps(diff)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="8f6810c",
                        help="commit before the move (-: this checkout again)")
    parser.add_argument("--new", default="-",
                        help="commit after the move (default -: this checkout)")
    parser.add_argument("--league-steps", type=int, default=60)
    parser.add_argument("--arith-steps", type=int, default=20)
    parser.add_argument("--only", choices=sorted(WORKLOADS))
    parser.add_argument("--all-keys", action="store_true",
                        help="compare the wall-clock keys and columns too")
    args = parser.parse_args()
    steps = {"league": args.league_steps, "arith": args.arith_steps}
    started = machine()
    refs = {"old": {"ref": args.old, **commit(args.old)},
            "new": {"ref": args.new, **commit(args.new)}}
    results = {}
    with tempfile.TemporaryDirectory(prefix="house_parity_") as tmp:
        codes = {arm: ref if ref == "-" else str(export(ref, Path(tmp) / arm))
                 for arm, ref in (("old", args.old), ("new", args.new))}
        for workload in [args.only] if args.only else list(WORKLOADS):
            results[workload] = workload_parity(workload, steps[workload], codes, Path(tmp),
                                                args.all_keys)
    report(results)
    failed = any(r["differences"] for r in results.values())
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps({
        **refs, "machine": {**started, "loadavg_end": os.getloadavg()}, "tolerance": TOL,
        "all_keys": args.all_keys, "same": not failed, "workloads": results}, indent=1) + "\n")
    print(f"\n{'DIFFERENT' if failed else 'same'}; result: {RESULT.relative_to(ROOT)}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
