"""What online control needs at run time: its endpoint file, the live fields every kind shares
(a workload adds its own: :meth:`agentrt.controller.workload.Workload.live_fields`), the refusal
error.

The ``control:`` settings are :class:`agentrt.config.control.ControlConfig`.
"""

from __future__ import annotations

from agentrt.core.errors import AgentrtError

ENDPOINT = "control.json"

#: Fields of every LM policy's section a running run takes (``<section>.<field>``: ``policy.``
#: in a train config, ``policies.<index>.`` in the others); the learning rate of learners only.
POLICY_LIVE = ("rollout.sampling.temperature", "rollout.sampling.top_p",
               "rollout.sampling.top_k", "rollout.sampling.max_new_tokens", "optim.lr")
#: Fields every kind's running run takes (``control.step_interval_s`` is the rollout frequency).
SHARED_LIVE = ("eval.every", "checkpoint.every", "control.step_interval_s")


class ControlError(AgentrtError):
    """A control command is refused, or the run cannot be reached."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
