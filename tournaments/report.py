"""Tournament report: leaderboard, rating curves, win-rate curves and payoff heat map in one HTML.

Everything is recomputed from the match records alone (``matches.sqlite`` in the run folder), so
a report can be written at the end of a run, on demand during it, or later from a copied folder.
Matches of any number of seats count: scores, win-rate curves and the payoff matrix are pairwise
between seats (see :mod:`agentrt.tournaments.ratings`), seat scores are shown per env.
Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot global state, no
display needed) and embedded as base64 PNGs, so the HTML file is self-contained.
"""

from __future__ import annotations

import base64
import html
import json
import io
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from agentrt.tournaments.ratings import (
    ALL,
    ELO_PER_NATURAL_UNIT,
    OpenSkillRatings,
    WinMatrix,
    fit_bradley_terry,
    pair_score,
    rated_view,
)
from agentrt.tournaments.records import MatchStore
from agentrt.tournaments.types import MatchResult


@dataclass(frozen=True)
class LeaderRow:
    """One leaderboard line. Ratings: OpenSkill units (mu ~ 25); BT: Elo points, mean 0."""

    key: str
    conservative: float  # mu - 3 sigma
    mu: float
    sigma: float
    bt_elo: float
    bt_low: float
    bt_high: float
    games: int
    score: float  # mean score over its games, draws half
    invalid_per_game: float


def _player_stats(results: Sequence[MatchResult]) -> dict[str, list[float]]:
    """key -> [games, summed mean pairwise score vs the other players, invalid moves], over
    rated matches (an identity holding several seats counts once, see ``rated_view``)."""
    acc: dict[str, list[float]] = {}
    for r in results:
        keys, scores = rated_view(r)
        if len(keys) < 2:
            continue
        for i, key in enumerate(keys):
            row = acc.setdefault(key, [0, 0.0, 0])
            others = [pair_score(scores[i], s) for j, s in enumerate(scores) if j != i]
            row[0] += 1
            row[1] += sum(others) / len(others)
            row[2] += sum(n for k, n in zip(r.match.keys, r.invalid_moves) if k == key)
    return acc


def build_leaderboard(results: Sequence[MatchResult], env: str | None = None) -> list[LeaderRow]:
    """Leaderboard sorted by conservative OpenSkill rating, with BT (Elo scale, 95% CI).

    Args:
        results: Match results in play order (OpenSkill is order dependent).
        env: Only this env's matches (None: all envs pooled).
    """
    if env is not None:
        results = [r for r in results if r.match.env == env]
    ratings = OpenSkillRatings()
    for r in results:
        ratings.update(r)
    rows_os = {row.key: row for row in ratings.leaderboard(ALL)}
    if len(rows_os) < 2:
        return []
    matrix = WinMatrix.from_results(results, names=sorted(rows_os))
    bt = fit_bradley_terry(matrix)
    elo, scale = bt.elo(), ELO_PER_NATURAL_UNIT
    stats = _player_stats(results)
    rows = []
    for i, key in enumerate(matrix.names):
        o = rows_os[key]
        games, score, invalid = stats.get(key, [0, 0.0, 0])
        rows.append(LeaderRow(key, o.rating, o.mu, o.sigma, float(elo[i]),
                              float(bt.lower[i] * scale), float(bt.upper[i] * scale),
                              int(games), score / max(games, 1), invalid / max(games, 1)))
    return sorted(rows, key=lambda r: (-r.conservative, r.key))


def format_leaderboard(rows: Sequence[LeaderRow], top: int | None = None) -> str:
    """Plain-text table for the terminal (live progress and the end of a run)."""
    head = f"{'#':>3} {'player':<22} {'mu-3σ':>7} {'mu':>6} {'σ':>5} {'BT elo [95% CI]':>22} " \
           f"{'games':>6} {'score':>6} {'inv/g':>6}"
    lines = [head, "-" * len(head)]
    for i, r in enumerate(rows[:top] if top else rows, 1):
        ci = f"{r.bt_elo:+6.0f} [{r.bt_low:+5.0f},{r.bt_high:+5.0f}]"
        lines.append(f"{i:>3} {r.key[:22]:<22} {r.conservative:7.2f} {r.mu:6.2f} {r.sigma:5.2f} "
                     f"{ci:>22} {r.games:6d} {r.score:6.3f} {r.invalid_per_game:6.3f}")
    return "\n".join(lines)


SEAT_RESULTS = "seat_results.json"  # seat_table's rows, written beside the HTML report


@dataclass(frozen=True)
class SeatRow:
    """A player's results against one opponent in one of its seats (``seat`` None: all seats).
    Rates are pairwise per game (see :meth:`MatchStore.seat_outcomes`)."""

    player: str
    opponent: str
    seat: int | None
    games: int
    win: float
    draw: float
    loss: float
    invalid_per_game: float


_RATES = ("win_rate", "draw_rate", "loss_rate", "invalid_per_game")  # SeatRow's fields, in order


def seat_table(stats: dict[tuple[str, str, int], dict[str, float]], order: Sequence[str] = ()
               ) -> list[SeatRow]:
    """Rows of :meth:`MatchStore.seat_outcomes` ``stats``, every ordered pair of identities that
    met: one row per seat of the player, then one over all its seats when it played more than
    one; players in ``order`` first (e.g. leaderboard order), then by key; opponents the same."""
    rank = {k: i for i, k in enumerate(order)}

    def sort_key(key: str) -> tuple[int, str]:
        return rank.get(key, len(rank)), key

    pairs: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
    for (me, opp, seat), s in stats.items():
        pairs.setdefault((me, opp), {})[seat] = s
    rows = []
    for me, opp in sorted(pairs, key=lambda p: (sort_key(p[0]), sort_key(p[1]))):
        by_seat = pairs[(me, opp)]
        for seat in sorted(by_seat):
            s = by_seat[seat]
            rows.append(SeatRow(me, opp, seat, int(s["games"]), *(s[f] for f in _RATES)))
        if len(by_seat) > 1:  # all seats: the per-seat rates weighted by games
            n = sum(s["games"] for s in by_seat.values())
            pooled = [sum(s["games"] * s[f] for s in by_seat.values()) / n for f in _RATES]
            rows.append(SeatRow(me, opp, None, int(n), *pooled))
    return rows


def format_seat_table(rows: Sequence[SeatRow]) -> str:
    """Plain-text table: player, opponent, seat, games, win / draw / loss rates, invalid moves
    per game."""
    head = (f"{'player':<16} {'opponent':<16} {'seat':>4} {'games':>6} {'win':>6} {'draw':>6} "
            f"{'loss':>6} {'inv/g':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        seat = "all" if r.seat is None else str(r.seat)
        lines.append(f"{r.player[:16]:<16} {r.opponent[:16]:<16} {seat:>4} {r.games:6d} "
                     f"{r.win:6.3f} {r.draw:6.3f} {r.loss:6.3f} {r.invalid_per_game:6.3f}")
    return "\n".join(lines)


def rating_history(results: Sequence[tuple[MatchResult, int]]
                   ) -> dict[str, list[tuple[int, float, float]]]:
    """OpenSkill (step, mu, sigma) of every player after each step, replaying in record order."""
    ratings = OpenSkillRatings()
    history: dict[str, list[tuple[int, float, float]]] = {}
    for i, (r, step) in enumerate(results):
        ratings.update(r)
        if i + 1 == len(results) or results[i + 1][1] != step:
            for row in ratings.leaderboard(ALL):
                history.setdefault(row.key, []).append((step, row.mu, row.sigma))
    return history


def win_rate_curves(results: Sequence[tuple[MatchResult, int]], bins: int = 20
                    ) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Score of each trained player over time against each opponent group.

    Pairwise per seat: a learning seat scores 1 / 0.5 / 0 against each other seat holding a
    different identity. Snapshots are grouped as ``"<policy>@*"``; fixed opponents stay
    themselves.

    Returns:
        ``{learner: {opponent group: [(mean step of bin, mean score), ...]}}``.
    """
    per: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for r, step in results:
        players = r.match.players
        for me, p in enumerate(players):
            if p.snapshot or not any(q.learning for q in players if q.key == p.key):
                continue
            for opp, o in enumerate(players):
                if o.key == p.key:
                    continue
                s = pair_score(r.scores[me], r.scores[opp])
                group = f"{o.policy_id}@*" if o.snapshot else o.key
                per.setdefault(p.key, {}).setdefault(group, []).append((step, s))
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for learner, groups in per.items():
        for group, pts in groups.items():
            arr = np.array(pts, dtype=float)
            edges = np.linspace(arr[:, 0].min(), arr[:, 0].max() + 1e-9, bins + 1)
            idx = np.clip(np.digitize(arr[:, 0], edges) - 1, 0, bins - 1)
            curve = [(float(arr[idx == b, 0].mean()), float(arr[idx == b, 1].mean()))
                     for b in range(bins) if np.any(idx == b)]
            out.setdefault(learner, {})[group] = curve
    return out


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def plot_rating_curves(history: dict[str, list[tuple[int, float, float]]], top: int = 10
                       ) -> Figure:
    """Conservative rating (mu - 3 sigma) per step, with the mu ± sigma band, top players."""
    fig = Figure(figsize=(8, 4.5), dpi=100)
    ax = fig.add_subplot()
    final = sorted(history, key=lambda k: -(history[k][-1][1] - 3 * history[k][-1][2]))
    for key in final[:top]:
        arr = np.array(history[key])
        line, = ax.plot(arr[:, 0], arr[:, 1] - 3 * arr[:, 2], label=key, lw=1.8)
        ax.fill_between(arr[:, 0], arr[:, 1] - arr[:, 2], arr[:, 1] + arr[:, 2],
                        color=line.get_color(), alpha=0.12)
    ax.set(xlabel="training step", ylabel="OpenSkill rating (line: mu-3σ, band: mu±σ)",
           title="Ratings over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def plot_win_rate_curves(curves: dict[str, dict[str, list[tuple[float, float]]]]) -> Figure:
    """One panel per trained player: score vs each opponent group over training steps."""
    n = max(1, len(curves))
    fig = Figure(figsize=(8, 3.2 * n), dpi=100)
    for i, (learner, groups) in enumerate(sorted(curves.items()), 1):
        ax = fig.add_subplot(n, 1, i)
        for group, pts in sorted(groups.items()):
            arr = np.array(pts)
            ax.plot(arr[:, 0], arr[:, 1], marker="o", ms=3, label=f"vs {group}")
        ax.axhline(0.5, color="grey", lw=0.8, ls="--")
        ax.set(ylim=(-0.02, 1.02), xlabel="training step", ylabel="score (draw = 0.5)",
               title=f"{learner}: win rate by opponent")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def plot_payoff(matrix: WinMatrix, order: Sequence[str] | None = None) -> Figure:
    """Heat map of the score of row player vs column player (draws half; blank: never met)."""
    names = list(order) if order is not None else matrix.names
    idx = [matrix.names.index(k) for k in names]
    pay = matrix.payoff()[np.ix_(idx, idx)]
    games = matrix.games[np.ix_(idx, idx)]
    size = min(14.0, 2.5 + 0.5 * len(names))
    fig = Figure(figsize=(size + 1.5, size), dpi=100)
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(pay), cmap="RdYlGn", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    if len(names) <= 12:
        for i in range(len(names)):
            for j in range(len(names)):
                if games[i, j] > 0:
                    ax.text(j, i, f"{pay[i, j]:.2f}\n({int(games[i, j])})", ha="center",
                            va="center", fontsize=7)
    ax.set(title="Payoff: row's score vs column (games)", xlabel="opponent", ylabel="player")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    return fig


def plot_eval_curves(rows: Sequence[dict[str, Any]]) -> Figure | None:
    """The run's evaluations (metrics.jsonl ``eval/win_rate_vs_*`` and ``eval/return_vs_*``,
    one line per learner and opponent; exact ``eval/nash_conv/*``, ``eval/br_value/*``,
    ``eval/blunders/*`` and
    ``eval/nash_conv_mixture/*``; the exploiter's ``eval/exploiter/*``) over training steps;
    None when there are none."""
    panels = {"win_rate": "evaluation: win rate", "return": "evaluation: mean return",
              "nash_conv": "exploitability: NashConv (exact)",
              "br_value": "exploitability: best-response value (exact)",
              "blunders": "exploitability: states where greedy play gives value away (exact)",
              "nash_conv_mixture": "exploitability: NashConv of the meta-strategy (exact)",
              "exploiter": "exploitability: exploiter's final win rate (approximate)"}
    series: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for row in rows:
        for key, value in row.items():
            kind = next((k for k in sorted(panels, key=len, reverse=True)  # longest first
                         if key.startswith((f"eval/{k}_vs_", f"eval/{k}/"))), None)
            if kind == "exploiter" and not key.startswith("eval/exploiter/win_rate"):
                continue  # its draw and loss rates stay in metrics.jsonl
            if kind is not None and isinstance(value, (int, float)):
                label = key.removeprefix(f"eval/{kind}_").removeprefix(f"eval/{kind}/")
                series.setdefault(kind, {}).setdefault(label, []).append((row["step"], value))
    if not series:
        return None
    fig = Figure(figsize=(8, 3.2 * len(series)), dpi=100)
    for i, (kind, lines) in enumerate(sorted(series.items(), reverse=True), 1):
        ax = fig.add_subplot(len(series), 1, i)
        for label, pts in sorted(lines.items()):
            arr = np.array(pts)
            ax.plot(arr[:, 0], arr[:, 1], marker="o", ms=3, label=label)
        ax.set(xlabel="training step", title=panels[kind])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def _run_sections(run_dir: Path) -> list[str]:
    """The run folder's evaluation curves and its resolved config (when it has them)."""
    from agentrt.controller.run_dir import read_jsonl

    out = []
    fig = plot_eval_curves(read_jsonl(run_dir / "metrics.jsonl"))
    if fig is not None:
        out.append(f"<h2>Evaluation curves</h2><img alt='Evaluation curves' "
                   f"src='data:image/png;base64,{_png(fig)}'/>")
    config = run_dir / "config.yaml"
    if config.is_file():
        out.append(f"<h2>Resolved config</h2><pre>{html.escape(config.read_text())}</pre>")
    return out


def write_report(source: MatchStore | str | Path, out: str | Path | None = None,
                 title: str = "agentrt tournament", env: str | None = None) -> Path:
    """Writes the self-contained HTML report and returns its path.

    Args:
        source: A :class:`MatchStore`, its database file, or the run folder holding it.
        out: HTML path (default: ``report.html`` beside the database).
        title: Page title.
        env: Only this env's matches (None: all envs pooled).
    """
    store = source if isinstance(source, MatchStore) else MatchStore(source)
    try:
        stepped = store.results(env=env)
        envs = sorted({r.match.env for r, _ in stepped})
        seats = {e: store.seat_stats(e) for e in envs}
        outcomes = store.seat_outcomes(env)
    finally:
        if store is not source:
            store.close()
    results = [r for r, _ in stepped]
    rows = build_leaderboard(results)
    seat_text = "; ".join(
        f"{html.escape(e)}: " + ", ".join(f"seat {k} {v['score']:.3f} over {v['games']}"
                                          for k, v in sorted(by_seat.items()))
        for e, by_seat in seats.items())
    run_dir = store.path.parent
    sections = [f"<p>run folder: {html.escape(str(run_dir.resolve()))}</p>",
                f"<p>{len(results)} matches; envs: {html.escape(', '.join(envs)) or '-'}; "
                f"mean score per seat: {seat_text or '-'}</p>",
                "<h2>Leaderboard</h2>", _leaderboard_html(rows)]
    if rows:
        curves = win_rate_curves(stepped)  # empty in rating-only runs (nobody trains)
        figures = [("Rating curves", plot_rating_curves(rating_history(stepped)))]
        if curves:
            figures.append(("Win-rate curves", plot_win_rate_curves(curves)))
        figures.append(("Payoff matrix", plot_payoff(WinMatrix.from_results(results),
                                                     order=[r.key for r in rows])))
        for name, fig in figures:
            sections.append(f"<h2>{name}</h2><img alt='{name}' "
                            f"src='data:image/png;base64,{_png(fig)}'/>")
    table = seat_table(outcomes, [r.key for r in rows])
    sections += ["<h2>Win / draw / loss by opponent and seat</h2>", _seat_table_html(table),
                 *_run_sections(run_dir)]
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            + "\n".join(sections) + "</body></html>")
    path = Path(out) if out is not None else run_dir / "report.html"
    _atomic_write_text(path, page)
    _atomic_write_text(path.with_name(SEAT_RESULTS),
                       json.dumps([asdict(r) for r in table], indent=1) + "\n")
    return path


_CSS = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto}"
        "table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #ddd;"
        "text-align:right}td:nth-child(2),th:nth-child(2){text-align:left}img{max-width:100%}"
        "table.seats td:nth-child(1),table.seats th:nth-child(1){text-align:left}")


def _leaderboard_html(rows: Sequence[LeaderRow]) -> str:
    if not rows:
        return "<p>Not enough rated matches yet.</p>"
    head = ("<tr><th>#</th><th>player</th><th>mu-3σ</th><th>mu</th><th>σ</th><th>BT Elo</th>"
            "<th>95% CI</th><th>games</th><th>score</th><th>invalid/game</th></tr>")
    body = "".join(
        f"<tr><td>{i}</td><td>{html.escape(r.key)}</td><td>{r.conservative:.2f}</td>"
        f"<td>{r.mu:.2f}</td><td>{r.sigma:.2f}</td><td>{r.bt_elo:+.0f}</td>"
        f"<td>[{r.bt_low:+.0f}, {r.bt_high:+.0f}]</td><td>{r.games}</td><td>{r.score:.3f}</td>"
        f"<td>{r.invalid_per_game:.3f}</td></tr>" for i, r in enumerate(rows, 1))
    return f"<table>{head}{body}</table>"


def _seat_table_html(rows: Sequence[SeatRow]) -> str:
    if not rows:
        return "<p>No matches between different players yet.</p>"
    head = ("<tr><th>player</th><th>opponent</th><th>seat</th><th>games</th><th>win</th>"
            "<th>draw</th><th>loss</th><th>invalid/game</th></tr>")
    body = "".join(
        f"<tr><td>{html.escape(r.player)}</td><td>{html.escape(r.opponent)}</td>"
        f"<td>{'all' if r.seat is None else r.seat}</td><td>{r.games}</td><td>{r.win:.3f}</td>"
        f"<td>{r.draw:.3f}</td><td>{r.loss:.3f}</td><td>{r.invalid_per_game:.3f}</td></tr>"
        for r in rows)
    return f"<table class='seats'>{head}{body}</table>"


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
