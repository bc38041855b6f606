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


def plot_metrics(rows: list[dict[str, Any]], out: Path) -> Path | None:
    """Draws every panel that has data; returns the PNG path (None when there is nothing)."""
    panels = [(k, t) for k, t in PANELS if any(k in r for r in rows)]
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
    for ax, (key, title) in zip(axes.flat, panels):
        pts = [(r["step"], r[key]) for r in rows if key in r and r[key] is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if len(pts) < 30 else None)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
