"""Decomposer report: success per subtask type, the routing matrix over time and example chains,
in one self-contained HTML file.

Everything is recomputed from the run folder (``metrics.jsonl``, ``chains.jsonl`` of the
training chains, ``eval_chains.jsonl`` of the evaluations), so ``agentrt decompose report
RUN_DIR`` redraws it at any time, during a run or from a copied folder.
"""

from __future__ import annotations

import base64
import html
import io
from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from agentrt.core.errors import AgentrtError
from agentrt.controller.run_dir import atomic_write_text, read_jsonl


def routing_over_time(chains: list[dict[str, Any]]) -> dict[str, dict[str, dict[int, int]]]:
    """subtask type -> policy -> step -> subtasks routed (training chains)."""
    out: dict[str, dict[str, dict[int, int]]] = defaultdict(lambda: defaultdict(
        lambda: defaultdict(int)))
    for c in chains:
        for s in c["steps"]:
            out[s["type"]][s["policy"]][int(c["step"])] += 1
    return out


def routing_table(chains: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[int, float]]:
    """(subtask type, policy) -> (subtasks, success rate) over the training chains."""
    acc: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for c in chains:
        for s in c["steps"]:
            cell = acc[(s["type"], s["policy"])]
            cell[0] += 1
            cell[1] += bool(s["ok"])
    return {k: (n, ok / n) for k, (n, ok) in acc.items()}


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return base64.b64encode(buf.getvalue()).decode()


def plot_eval(metrics: list[dict[str, Any]]) -> Figure | None:
    rows = [r for r in metrics if "eval/success" in r]
    if not rows:
        return None
    fig = Figure(figsize=(7, 3.5))
    ax = fig.add_subplot()
    keys = ["eval/success", "eval/plan_valid"] + sorted(
        {k for r in rows for k in r if k.startswith("eval/subtask_success/")})
    for key in keys:
        pts = [(r["step"], r[key]) for r in rows if key in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                lw=2.5 if key == "eval/success" else 1.2, label=key.removeprefix("eval/"))
    ax.set(xlabel="step", ylabel="held-out rate", ylim=(-0.02, 1.02))
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_routing(over_time: dict[str, dict[str, dict[int, int]]]) -> Figure | None:
    """Share of each subtask type's traffic per policy, step by step (types with several)."""
    shared = {t: pols for t, pols in over_time.items() if len(pols) > 1}
    if not shared:
        return None
    fig = Figure(figsize=(7, 2.2 * len(shared)))
    for i, (kind, pols) in enumerate(sorted(shared.items())):
        ax = fig.add_subplot(len(shared), 1, i + 1)
        steps = sorted({s for counts in pols.values() for s in counts})
        totals = [sum(pols[p].get(s, 0) for p in pols) for s in steps]
        bottom = [0.0] * len(steps)
        for pid in sorted(pols):
            share = [pols[pid].get(s, 0) / t if t else 0.0 for s, t in zip(steps, totals)]
            ax.bar(steps, share, bottom=bottom, label=pid, width=1.0)
            bottom = [b + v for b, v in zip(bottom, share)]
        ax.set(title=f"{kind}: share of traffic per policy", ylim=(0, 1), ylabel="share")
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def _success_table(metrics: list[dict[str, Any]]) -> list[str]:
    """Held-out success (task, plan validity, each subtask type) at the first and last eval."""
    e = html.escape
    parts: list[str] = []
    last = [r for r in metrics if "eval/success" in r]
    if last:
        first, end = last[0], last[-1]
        kinds = sorted({k.removeprefix("eval/subtask_success/") for r in last for k in r
                        if k.startswith("eval/subtask_success/")})
        rows = [("task success", "eval/success"), ("plan validity", "eval/plan_valid")]
        rows += [(f"subtask {k}", f"eval/subtask_success/{k}") for k in kinds]
        parts.append("<h2>Held-out success</h2><table><tr><th></th>"
                     f"<th>step {first['step']}</th><th>step {end['step']}</th></tr>"
                     + "".join(f"<tr><td>{e(name)}</td><td>{first.get(key, float('nan')):.3f}"
                               f"</td><td>{end.get(key, float('nan')):.3f}</td></tr>"
                               for name, key in rows) + "</table>")
    return parts


def _example_chains(evals: list[dict[str, Any]]) -> list[str]:
    """The newest evaluation's example chains, one table of steps each."""
    e = html.escape
    parts: list[str] = []
    if evals:
        latest = evals[-1]
        parts.append(f"<h2>Example chains (held-out, step {latest['step']})</h2>")
        for c in latest["chains"]:
            steps = "".join(
                f"<tr><td>{e(s['type'])}</td><td>{e(s['policy'])}</td>"
                f"<td><code>{e(s['observation'].strip())}</code></td>"
                f"<td><code>{e(s['output'])}</code></td>"
                f"<td>{'ok' if s['ok'] else 'FAIL: ' + e(s['reason'])}</td></tr>"
                for s in c["steps"])
            parts.append(
                f"<p><b>{e(c.get('task', ''))}</b><br>plan: <code>{e(c.get('plan', ''))}</code>"
                f" by {e(c.get('planner', ''))} &rarr; <b>{e(c['outcome'])}</b> "
                f"{e(c.get('reason') or '')}</p><table><tr><th>type</th><th>policy</th>"
                f"<th>observation</th><th>output</th><th>verdict</th></tr>{steps}</table>")
    return parts


def write_report(run_dir: str | Path) -> Path:
    """Writes ``report.html`` in ``run_dir`` and returns its path."""
    run_dir = Path(run_dir)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    chains = read_jsonl(run_dir / "chains.jsonl")
    evals = read_jsonl(run_dir / "eval_chains.jsonl")
    if not chains and not evals:  # a run of 0 steps (a warm start only) has its evaluation
        raise AgentrtError(f"{run_dir} holds no readable chain record (chains.jsonl, "
                           "eval_chains.jsonl); give the folder of a decomposer run that played "
                           "a step or an evaluation")
    e = html.escape
    parts = [f"<h1>Decomposer run {e(run_dir.name)}</h1>"]
    parts += _success_table(metrics)
    fig = plot_eval(metrics)
    if fig is not None:
        parts.append(f'<img src="data:image/png;base64,{_png(fig)}">')
    table = routing_table(chains)
    if table:
        kinds = sorted({k for k, _ in table})
        pids = sorted({p for _, p in table})
        head = "".join(f"<th>{e(p)}</th>" for p in pids)
        body = "".join(
            f"<tr><td>{e(k)}</td>" + "".join(
                f"<td>{table[(k, p)][0]} ({table[(k, p)][1]:.0%} ok)</td>" if (k, p) in table
                else "<td></td>" for p in pids) + "</tr>" for k in kinds)
        parts.append("<h2>Routing matrix (training chains: subtasks routed, success)</h2>"
                     f"<table><tr><th>subtask type</th>{head}</tr>{body}</table>")
    fig = plot_routing(routing_over_time(chains))
    if fig is not None:
        parts.append("<h2>Routing over time</h2>"
                     f'<img src="data:image/png;base64,{_png(fig)}">')
    parts += _example_chains(evals)
    style = ("body{font-family:sans-serif;max-width:1000px;margin:auto}table{border-collapse:"
             "collapse;margin:6px 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}")
    doc = (f"<!doctype html><html><head><meta charset='utf-8'><title>decomposer report</title>"
           f"<style>{style}</style></head><body>{''.join(parts)}</body></html>")
    out = run_dir / "report.html"
    atomic_write_text(out, doc)
    return out
