"""What one episode was: its :class:`EpisodeRecord` and how its agents fared.

Both paths of the runner write these: the per-episode loop (:mod:`agentrt.runner.core`) and the
vectorized fast path (:mod:`agentrt.runner.vector`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class EpisodeRecord:
    """What happened in one episode (all agents, trainable or not)."""

    episode_id: str
    env: str
    seed: int
    seats: dict[str, str]
    returns: dict[str, float]
    results: dict[str, str]
    num_actions: int
    invalid: dict[str, int]
    ended_by: str
    final_infos: dict[str, dict[str, Any]]
    policy_versions: dict[str, int]

    @property
    def truncated(self) -> bool:
        return self.ended_by in ("truncated", "turn_limit", "context")


def episode_results(returns: dict[str, float], forfeit: str | None, ended_by: str
                    ) -> dict[str, str]:
    """Per-agent result: "win"/"draw"/"loss" in games, "solved"/"failed" for one agent.

    A forfeit (invalid action) loses and the others win; a turn-limit or context end is a draw;
    otherwise the strictly highest return wins and a tie at the top is a draw.
    """
    agents = list(returns)
    if len(agents) == 1:
        return {agents[0]: "solved" if returns[agents[0]] > 0 else "failed"}
    if forfeit is not None:
        return {a: "loss" if a == forfeit else "win" for a in agents}
    if ended_by in ("turn_limit", "context"):
        return dict.fromkeys(agents, "draw")
    best = max(returns.values())
    top = [a for a in agents if returns[a] == best]
    if len(top) == len(agents):
        return dict.fromkeys(agents, "draw")
    return {a: ("win" if len(top) == 1 else "draw") if a in top else "loss" for a in agents}
