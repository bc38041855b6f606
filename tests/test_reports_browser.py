"""The HTML reports render in a real browser: Debian's chromium, driven by Python's playwright.

A short league (the Nim plugin) and a short decomposer run write their report.html; the browser
loads each from disk and the tests read what a person would see: the sections, every figure
decoded (not a broken image), the leaderboard's and routing matrix's rows, no script error, and a
full-page screenshot whose figures hold real pixels. ``make test`` installs chromium with apt.
"""

from __future__ import annotations

import io
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "plugin_pkg"
TOOLS = ROOT / "tests" / "decomposer"  # decompose_tools: calc, odd_format
AGENTRT = [sys.executable, "-m", "agentrt.cli"]
# Flags for a closed network (no background lookups) and a root user (no sandbox).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "chromium is not installed: `make test` installs it (apt-get install chromium)"
    return found


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS,
                              headless=True)
        yield b
        b.close()


def agentrt(*args: str, cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENTRT, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(pythonpath)})


class Seen:
    """What the browser shows of one page."""

    def __init__(self, browser: Any, path: Path, shot: Path) -> None:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        self.errors: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.on("console", lambda msg: self.errors.append(msg.text) if msg.type == "error"
                else None)
        page.goto(path.resolve().as_uri())
        page.wait_for_load_state("load")
        self.headings = page.locator("h2").all_inner_texts()
        self.images = page.eval_on_selector_all(
            "img", "els => els.map(e => ({alt: e.alt, ok: e.complete && e.naturalWidth > 0,"
                   " w: e.naturalWidth, h: e.naturalHeight, shown: e.getBoundingClientRect().width}))")
        self.tables = page.eval_on_selector_all(
            "table", "ts => ts.map(t => Array.from(t.rows).map("
                     "r => Array.from(r.cells).map(c => c.innerText.trim())))")
        page.screenshot(path=str(shot), full_page=True)
        self.shot = Image.open(io.BytesIO(shot.read_bytes())).convert("RGB")
        self.figure_shots = [Image.open(io.BytesIO(el.screenshot())).convert("RGB")
                             for el in page.locator("img").all()]
        page.close()


def colours(img: Image.Image) -> int:
    return len(set(img.resize((200, 200)).getdata()))


@pytest.fixture(scope="module")
def league(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("league")
    run = tmp / "run"
    proc = agentrt("tournament", "run", str(PLUGIN / "nim_league.yaml"), "--run-dir", str(run),
                   "--set", "policies.0.model.preset=llama-nano", "--set", "train.steps=3",
                   "--set", "train.games_per_step=8", "--set", "warm_start.steps=2",
                   "--set", "eval.every=1", "--set", "eval.games=4",
                   "--set", "schedule.snapshot.every=1", "--set", "schedule.snapshot.min_steps=1",
                   "--set", "progress=false", cwd=tmp, pythonpath=PLUGIN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


def test_league_report_renders_in_chromium(browser, league: Path, tmp_path: Path) -> None:
    seen = Seen(browser, league / "report.html", tmp_path / "league.png")
    assert seen.errors == []
    figures = ["Rating curves", "Win-rate curves", "Payoff matrix", "Evaluation curves"]
    table = "Win / draw / loss by opponent and seat"  # a table, not an image
    assert seen.headings == ["Leaderboard", *figures[:3], table, figures[3],
                             "Resolved config"], seen.headings
    assert [i["alt"] for i in seen.images] == figures
    assert all(i["ok"] and i["w"] >= 300 and i["h"] >= 200 and i["shown"] > 300
               for i in seen.images), seen.images
    with sqlite3.connect(league / "matches.sqlite") as db:
        players = {k for (k,) in db.execute("SELECT DISTINCT player_key FROM seats")}
    board = seen.tables[0]
    assert board[0][:2] == ["#", "player"]
    names = [row[1] for row in board[1:]]  # every player of a match, snapshots included, once
    assert sorted(names) == sorted(players) and {"lm", "lm@1", "random", "perfect"} <= players
    assert [row[0] for row in board[1:]] == [str(i) for i in range(1, len(names) + 1)]
    # the page and each figure on it hold real pixels (a blank or broken image has a few colours)
    assert seen.shot.height > 1500 and colours(seen.shot) > 50
    assert all(colours(f) > 20 for f in seen.figure_shots), [colours(f) for f in seen.figure_shots]


@pytest.fixture(scope="module")
def decomposition(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("decompose")
    config = tmp / "dec.yaml"
    config.write_text(f"""
imports: [decompose_tools]
seed: 0
run_dir: {tmp / 'run'}
progress: false
family: {{name: wordchain, train_size: 50, eval_size: 6}}
planner: {{kind: rule, max_subtasks: 4}}
policies:
  - {{id: reader, model: {{preset: llama-nano}}, skills: [parse],
      rollout: {{sampling: {{max_new_tokens: 8}}}}}}
tools:
  - {{id: calc, fn: "decompose_tools:calc", skills: [parse, add, sub, mul, div]}}
  - {{id: odd_format, fn: "decompose_tools:odd_format", skills: [format]}}
router: {{exploration: epsilon, epsilon: 0.5}}
train: {{steps: 2, tasks_per_step: 4, group_size: 2}}
eval: {{every: 1, size: 6}}
""")
    proc = agentrt("decompose", "run", str(config), cwd=tmp, pythonpath=TOOLS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "run"


def test_decomposer_report_renders_in_chromium(browser, decomposition: Path,
                                               tmp_path: Path) -> None:
    seen = Seen(browser, decomposition / "report.html", tmp_path / "decompose.png")
    assert seen.errors == []
    for heading in ["Held-out success", "Routing over time"]:
        assert heading in seen.headings, seen.headings
    assert any(h.startswith("Routing matrix") for h in seen.headings)
    assert any(h.startswith("Example chains") for h in seen.headings)
    assert seen.images and all(i["ok"] and i["w"] >= 300 for i in seen.images), seen.images
    routing = next(t for t in seen.tables if t[0] and t[0][0] == "subtask type")
    types = {row[0] for row in routing[1:]}
    assert {"parse", "format"} <= types, routing
    assert colours(seen.shot) > 50 and all(colours(f) > 20 for f in seen.figure_shots)
