"""Progress of long work: a rich bar on a terminal; plain lines when output is redirected.

Redirected (CI, nohup, ``make demo > log``), a bar would print nothing until the end, so the
progress becomes one line per step, at most one every ``every_s`` seconds (step, seconds per
step, ETA, the key figures), and every evaluation is printed on its own line as it arrives.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

# metric -> its name beside the bar or in a line
SHOWN = {"reward/mean": "reward", "eval/accuracy": "accuracy", "actor/kl": "kl",
         "sft/loss": "sft_loss", "actor/entropy": "entropy"}


class StepProgress:
    """A bar over training steps that shows the latest key metrics beside it.

    Args:
        total: Steps of the work.
        enabled: False shows nothing.
        start: Steps already done (a resumed run).
        label: Name of the work in the bar or lines.
        every_s: Redirected output: the least seconds between two step lines (evaluations and
            the last step are always printed).
        stream: Where plain lines go (default: stderr); a stream that is not a terminal, or
            ``stream`` given, gets plain lines instead of a bar.
    """

    def __init__(self, total: int, enabled: bool = True, start: int = 0, label: str = "train",
                 every_s: float = 10.0, stream: IO[str] | None = None):
        self._last_eval: dict[str, float] = {}
        self._progress: Progress | None = None
        self._lines: _Lines | None = None
        if not enabled or total <= 0:
            return
        console = Console(stderr=True)
        if stream is not None or not console.is_terminal:
            self._lines = _Lines(label, total, start, every_s, stream or sys.stderr)
            return
        self._progress = Progress(
            TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
            TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
            console=console, transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(label, total=total, completed=start, info="")

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        evals = {k: v for k, v in metrics.items() if k.startswith("eval/")}
        self._last_eval |= evals
        shown = {**metrics, **self._last_eval}
        info = "  ".join(f"{name}={shown[k]:.3g}" for k, name in SHOWN.items() if k in shown)
        if self._lines is not None:
            self._lines.update(step, info, evals)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class _Lines:
    """Plain progress lines for output that is not a terminal."""

    def __init__(self, label: str, total: int, start: int, every_s: float, stream: IO[str]):
        self.label, self.total, self.start, self.every_s = label, total, start, every_s
        self.stream = stream
        self.t0 = self.last = time.monotonic()

    def update(self, step: int, info: str, evals: dict[str, float]) -> None:
        now = time.monotonic()
        if step > self.start and (now - self.last >= self.every_s or step >= self.total or evals):
            done = max(step - self.start, 1)
            per_step = (now - self.t0) / done
            eta = per_step * max(self.total - step, 0)
            self._print(f"{self.label} step {step}/{self.total}  {per_step:.3g} s/step  "
                        f"ETA {_clock(eta)}  {info}".rstrip())
            self.last = now
        if evals:
            shown = "  ".join(f"{k.removeprefix('eval/')}={v:.3g}" for k, v in evals.items()
                              if isinstance(v, (int, float)))
            self._print(f"{self.label} step {step}/{self.total} eval: {shown}")

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


def _clock(seconds: float) -> str:
    """'1h02m', '4m05s' or '12s'."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
