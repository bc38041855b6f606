"""What online control needs at run time: its endpoint file, the live fields, the refusal error.

The ``control:`` settings are :class:`agentrt.config.control.ControlConfig`.
"""

from __future__ import annotations

from agentrt.core.errors import AgentrtError

ENDPOINT = "control.json"

#: Config fields a running run takes (``control.step_interval_s`` is the rollout frequency).
LIVE = ("train.prompts_per_step", "train.group_size", "policy.rollout.sampling.temperature",
        "policy.rollout.sampling.top_p", "policy.rollout.sampling.top_k",
        "policy.rollout.sampling.max_new_tokens", "policy.optim.lr", "eval.every",
        "checkpoint.every", "control.step_interval_s")


class ControlError(AgentrtError):
    """A control command is refused, or the run cannot be reached."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
