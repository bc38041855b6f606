"""The episode runner (see ``agentrt.runner.core``) and its vectorized fast path."""

from __future__ import annotations

from agentrt.runner.core import (EpisodeRunner, EpisodeSpec, RunnerConfig, RunResult, specs,
                                 summarize)
from agentrt.runner.record import EpisodeRecord, episode_results

__all__ = ["EpisodeRecord", "EpisodeRunner", "EpisodeSpec", "RunResult", "RunnerConfig",
           "episode_results", "specs", "summarize"]
