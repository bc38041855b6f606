"""The episode runner (see ``agentrt.runner.core``) and its vectorized fast path."""

from __future__ import annotations

from agentrt.runner.core import (
    EpisodeRecord,
    EpisodeRunner,
    EpisodeSpec,
    RunnerConfig,
    RunResult,
    episode_results,
    specs,
    summarize,
)

__all__ = ["EpisodeRecord", "EpisodeRunner", "EpisodeSpec", "RunResult", "RunnerConfig",
           "episode_results", "specs", "summarize"]
