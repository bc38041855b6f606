"""The HTML report: leaderboard order, embedded PNG figures, terminal table."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from tournament_sim import play

from agentrt.tournaments.config import build_scheduler
from agentrt.tournaments.records import MatchStore
from agentrt.tournaments.report import build_leaderboard, format_leaderboard, write_report
from agentrt.tournaments.types import Entrant, Player
from agentrt.tournaments.report import rating_history, win_rate_curves

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _strength(p: Player) -> float:
    # the learner improves with its version; snapshots keep the strength of their version
    return {"random": -1.0, "heuristic": 0.5}.get(p.policy_id, -1.5 + 0.15 * p.version)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 20-step PFSP run of one learner against snapshots and two scripted baselines."""
    path = tmp_path_factory.mktemp("run")
    sched = build_scheduler({"format": "pfsp", "snapshot": {"every": 5}},
                            [Entrant("lm", True), Entrant("random"), Entrant("heuristic")],
                            ["tictactoe"], seed=0)
    sched.on_step(0, {"lm": 0})
    with MatchStore(path) as store:
        for step in range(1, 21):
            results = [play(m, _strength, draw_scale=0.2) for m in sched.next_matches(24)]
            store.add(results, step)
            sched.report(results)
            sched.on_step(step, {"lm": step})
    return path


def test_report_is_one_html_file_with_embedded_figures(run_dir: Path) -> None:
    path = write_report(run_dir, title="ttt league")
    assert path == run_dir / "report.html"
    page = path.read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == 3  # rating curves, win-rate curves, payoff heat map
    for b64 in images:
        png = base64.b64decode(b64)
        assert png.startswith(PNG_MAGIC) and len(png) > 10_000
    for heading in ("Leaderboard", "Rating curves", "Win-rate curves", "Payoff matrix"):
        assert f"<h2>{heading}</h2>" in page
    text = re.sub(r"base64,[A-Za-z0-9+/=]+", "", page)
    assert not re.search(r"(src|href)=['\"]?https?:", text)  # self-contained: nothing fetched
    assert "480 matches" in page
    (run_dir / "payoff.png").write_bytes(base64.b64decode(images[2]))  # for a human look


def test_leaderboard_orders_the_trained_learner_above_random(run_dir: Path) -> None:
    with MatchStore(run_dir) as store:
        results = [r for r, _ in store.results()]
    rows = build_leaderboard(results)
    order = [r.key for r in rows]
    assert order.index("lm") < order.index("heuristic") < order.index("random")
    assert order.index("lm@0") > order.index("lm")
    top = rows[0]
    assert top.conservative == pytest.approx(top.mu - 3 * top.sigma)
    assert top.bt_low < top.bt_elo < top.bt_high
    assert sum(r.games for r in rows) == 2 * len(results)
    text = format_leaderboard(rows, top=3)
    assert len(text.splitlines()) == 5 and "lm" in text.splitlines()[2]


def test_curves_follow_the_learner(run_dir: Path) -> None:
    with MatchStore(run_dir) as store:
        stepped = store.results()
    history = rating_history(stepped)
    assert [s for s, _, _ in history["lm"]] == list(range(1, 21))
    assert history["lm"][-1][1] > history["lm"][0][1]  # mu rises as the learner improves
    curves = win_rate_curves(stepped, bins=4)
    assert set(curves) == {"lm"}
    assert set(curves["lm"]) == {"random", "heuristic", "lm@*"}
    vs_heuristic = [score for _, score in curves["lm"]["heuristic"]]
    assert vs_heuristic[-1] > vs_heuristic[0]


def test_report_of_an_empty_run_says_so(tmp_path: Path) -> None:
    page = write_report(tmp_path / "empty").read_text()
    assert "Not enough rated matches" in page and "base64" not in page


def test_rating_only_report_has_no_win_rate_curves(tmp_path: Path) -> None:
    sched = build_scheduler({"format": "round_robin", "rounds": 3},
                            [Entrant("ckpt1"), Entrant("ckpt2"), Entrant("random")], ["ttt"])
    with MatchStore(tmp_path) as store:
        while not sched.done:
            store.add([play(m, lambda p: {"random": -1.0}.get(p.key, 0.0))
                       for m in sched.next_matches(6)], step=sched.round)
        page = write_report(store).read_text()
    assert page.count("data:image/png;base64,") == 2
    assert "Win-rate curves" not in page and "<h2>Payoff matrix</h2>" in page
