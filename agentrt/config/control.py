"""The ``control:`` section of every run config: online control of a running run
(:mod:`agentrt.controller.control`, docs/control.md)."""

from __future__ import annotations

import re

from pydantic import Field, model_validator

from agentrt.core.schema import ConfigModel
from agentrt.memory.config import RedisConfig

# The names a run's control token may be read from: agentrt's own variables only, so a run
# folder's control.json cannot make `agentrt ctl` read another secret of the shell.
TOKEN_ENV = re.compile(r"^AGENTRT_[A-Z0-9_]+$")


class ControlHttpConfig(ConfigModel):
    enabled: bool = Field(True, description="Serve the HTTP control endpoint.")
    host: str = Field("127.0.0.1", description="Address it binds (0.0.0.0 exposes it to the "
                      "network; the token is then all that guards the run).")
    port: int = Field(0, ge=0, le=65535, description="TCP port; 0: a free one (control.json "
                      "says which).")

class ControlRedisConfig(RedisConfig):
    """A Redis stream of commands (one ``json`` field each); replies go to ``<stream>:replies``."""

    stream: str = Field("agentrt:control", min_length=1, description="Stream of commands.")

class FeedbackConfig(ConfigModel):
    max_staleness: int = Field(
        8, ge=0, description="Feedback for an episode more than this many steps older than the "
        "step it would join is logged and dropped.")
    max_groups_per_step: int = Field(
        64, gt=0, description="Prompt groups replayed for feedback in one step (they add rows "
        "to its batch); the rest, newest last, wait for the next step.")

class ControlConfig(ConfigModel):
    """Online control of a running train run (agentrt.controller.control, docs/control.md)."""

    enabled: bool = Field(False, description="Take commands while the run runs.")
    http: ControlHttpConfig = Field(default_factory=ControlHttpConfig)
    token_env: str = Field(
        "AGENTRT_CTL_TOKEN", min_length=1, pattern=TOKEN_ENV.pattern,
        description="Environment variable holding the HTTP token, named AGENTRT_... (the only "
        "names `agentrt ctl` reads); unset: a random token is made at start and written to "
        "control.json (0600).")
    redis: ControlRedisConfig | None = Field(
        None, description="Also read commands from a Redis stream ({url, stream}); None: no.")
    feedback: FeedbackConfig = Field(default_factory=FeedbackConfig)
    start_paused: bool = Field(
        False, description="Hold before the first step until `agentrt ctl RUN_DIR resume` (set "
        "values or a later pause first).")
    step_interval_s: float = Field(
        0.0, ge=0.0, description="Rollout frequency: at least this many seconds from the "
        "start of one step to the start of the next (the loop waits at the boundary); 0: no "
        "wait.")

    @model_validator(mode="after")
    def _a_channel(self) -> ControlConfig:
        if self.enabled and not self.http.enabled and self.redis is None:
            raise ValueError("control.enabled needs a channel: keep control.http.enabled or "
                             "set control.redis")
        return self
