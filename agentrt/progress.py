"""Terminal progress for long work (rich), silent when disabled or not a terminal."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

SHOWN = ("reward/mean", "eval/accuracy", "actor/kl", "sft/loss", "actor/entropy")


class StepProgress:
    """A bar over training steps that shows the latest key metrics beside it."""

    def __init__(self, total: int, enabled: bool = True, start: int = 0, label: str = "train"):
        self._last_eval: dict[str, float] = {}
        self._progress: Progress | None = None
        if enabled and total > 0:
            self._progress = Progress(
                TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
                TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                console=Console(stderr=True), transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(label, total=total, completed=start, info="")

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        if self._progress is None:
            return
        self._last_eval |= {k: v for k, v in metrics.items() if k.startswith("eval/")}
        shown = {**metrics, **self._last_eval}
        info = "  ".join(f"{k.split('/')[-1]}={shown[k]:.3g}" for k in SHOWN if k in shown)
        self._progress.update(self._task, completed=step, info=info)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
