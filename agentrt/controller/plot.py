"""PNG plot of a run's curves from metrics.jsonl rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PANELS = (
    ("reward/mean", "train reward"), ("eval/accuracy", "held-out accuracy"),
    ("actor/kl", "KL to reference"), ("actor/entropy", "entropy"),
    ("rollout/response_length", "response length"), ("actor/pg_loss", "policy loss"),
    ("critic/vf_loss", "value loss"), ("actor/grad_norm", "grad norm"),
)
# Panels of every metric with this prefix, one line each (e.g. per eval opponent of a league).
PREFIX_PANELS = (("eval/win_rate_vs_", "eval win rate"), ("eval/return_vs_", "eval mean return"),
                 ("eval/nash_conv/", "NashConv (exact)"),
                 ("eval/br_value/", "best-response value (exact)"),
                 ("eval/blunders/", "greedy blunders (exact)"))


def _label(key: str) -> str:
    """A prefix panel's line label: the opponent, or the env and seat of an exact measure."""
    if "_vs_" in key:
        return key.split("_vs_")[-1]
    return next((key.removeprefix(p) for p, _ in PREFIX_PANELS if key.startswith(p)), key)


def plot_metrics(rows: list[dict[str, Any]], out: Path) -> Path | None:
    """Draws every panel that has data; returns the PNG path (None when there is nothing)."""
    panels = [([k], t) for k, t in PANELS if any(k in r for r in rows)]
    for prefix, title in PREFIX_PANELS:
        keys = sorted({k for r in rows for k in r if k.startswith(prefix)})
        if keys:
            panels.append((keys, title))
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3 * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (keys, title) in zip(axes.flat, panels):
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if key in r and r[key] is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts],
                    marker="o" if len(pts) < 30 else None, label=_label(key))
        if len(keys) > 1 or _label(key) != key:
            ax.legend(fontsize=7, loc="best")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
