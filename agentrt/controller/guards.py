"""Numeric guards of the controller loop: a run that is going nowhere stops with one line.

Three checks, each with a config knob (``guards:`` in every run config, :class:`GuardsConfig`):

- **failed rewards**: a reward that raises, is NaN/inf or beyond ``±REWARD_LIMIT`` marks its
  sample failed (reward 0, counted in ``reward/errors`` and ``reward/error_rate``). A step where
  more than ``max_reward_error_rate`` of the samples failed stops the run *before* it trains on
  them: the zeros would be taught as if they were real rewards.
- **skipped updates**: a non-finite loss or gradient skips the optimizer step (the engine counts
  it in ``actor/skipped``); ``max_skipped_steps`` consecutive steps whose every update was
  skipped stop the run.
- **non-finite weights**: a checkpoint is never written with a NaN or inf in it; the run stops
  and the previous checkpoint stays the latest.

A stop raises :class:`RunStopped` (an :class:`~agentrt.core.errors.AgentrtError`: the CLI prints one
line and exits with code 2); resuming continues from the last checkpoint.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from agentrt.config.sections import GuardsConfig
from agentrt.core.errors import AgentrtError
from agentrt.rewards import REWARD_LIMIT


class RunStopped(AgentrtError):
    """The run stopped itself instead of training on garbage; its last checkpoint is kept."""


def nonfinite_tensors(state: Any, path: str = "") -> Iterator[str]:
    """Paths (``pools.policy.model.lm_head.weight``) of floating tensors in a nested
    dict/list state that hold a NaN or inf."""
    if isinstance(state, torch.Tensor):
        if state.is_floating_point() and not bool(torch.isfinite(state).all()):
            yield path
    elif isinstance(state, dict):
        for key, value in state.items():
            yield from nonfinite_tensors(value, f"{path}.{key}" if path else str(key))
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            yield from nonfinite_tensors(value, f"{path}.{i}" if path else str(i))


class RunGuard:
    """Applies :class:`GuardsConfig` to each step's metrics and each checkpoint's state."""

    def __init__(self, cfg: GuardsConfig) -> None:
        self.cfg = cfg
        self.skipped_in_a_row: dict[str, int] = {}
        self.saved_step: int | None = None  # the step of the newest checkpoint written

    def _kept(self) -> str:
        if self.saved_step is None:
            return "no checkpoint was written"
        return f"the checkpoint of step {self.saved_step} is kept; resuming starts there"

    def check_rewards(self, step: int, metrics: dict[str, float]) -> None:
        """Stops the run when too many of this step's rewards failed (before any update)."""
        rate = metrics.get("reward/error_rate")
        if rate is None or rate <= self.cfg.max_reward_error_rate:
            return
        down = [k.split("/")[1] for k, v in metrics.items()
                if k.startswith("reward/") and k.endswith("/unavailable") and v]
        if down:  # a reward service did not answer within its retries
            why = (f"reward service {', '.join(down)} did not answer within its retries "
                   f"(reward/{down[0]}/down_s={metrics.get(f'reward/{down[0]}/down_s', 0):.1f})")
            fix = "start the service (or fix its URL) and run again to resume"
        else:
            why = f"raised, NaN/inf or beyond ±{REWARD_LIMIT:g}"
            fix = "fix the reward function"
        raise RunStopped(
            f"step {step}: the reward failed on {rate:.0%} of the samples ({why}; more than "
            f"guards.max_reward_error_rate={self.cfg.max_reward_error_rate:g}); {fix}; "
            f"{self._kept()}")

    def check_updates(self, step: int, per_policy: dict[str, dict[str, float]]) -> None:
        """Counts steps whose every update was skipped for a non-finite loss or gradient."""
        limit = self.cfg.max_skipped_steps
        for pid, m in per_policy.items():
            if "actor/skipped" not in m:
                continue  # no update this step (no data): neither a skip nor a success
            skipped = m["actor/skipped"] >= 1.0
            run = self.skipped_in_a_row.get(pid, 0) + 1 if skipped else 0
            self.skipped_in_a_row[pid] = run
            if limit is not None and run >= limit:
                raise RunStopped(
                    f"step {step}: every update of policy {pid!r} was skipped for a non-finite "
                    f"loss or gradient {run} steps in a row (guards.max_skipped_steps={limit}); "
                    f"lower its optim.lr or check the rewards; {self._kept()}")

    def check_state(self, step: int, state: dict[str, Any]) -> None:
        """Refuses to checkpoint a state holding NaN or inf (the weights diverged)."""
        bad = next(nonfinite_tensors(state), None)
        if bad is not None:
            raise RunStopped(
                f"step {step}: {bad} holds NaN or inf (the weights diverged), so it is not "
                f"checkpointed; lower optim.lr; {self._kept()}")

    def saved(self, step: int) -> None:
        self.saved_step = step
