"""Late rewards (``feedback`` commands): the prompt groups a step trains again."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def feedback_groups(run_dir: Path, pending: dict[str, float], step: int, max_staleness: int,
                    max_groups: int) -> tuple[list[Any], dict[str, float], dict[str, float]]:
    """The trajectories a step trains on for the late rewards ``pending`` (episode id ->
    value): each episode's prompt group from the episode log, its rewards replaced where
    feedback came, as one group (the logged group key with ``replay_step``: its string is
    ``feedback|s<step>|<group>``); the ``control/feedback/`` metrics; and the feedback
    deferred to the next step (the groups past the ``max_groups`` oldest). Episodes more than
    ``max_staleness`` steps older than ``step`` are dropped."""
    from agentrt.controller.episodes import EpisodeLog
    from agentrt.core.types import GroupKey, Trajectory, Turn

    episodes = EpisodeLog(run_dir)
    groups: dict[tuple[int, str], dict[str, float]] = {}
    dropped = 0
    for eid, value in pending.items():
        ep = episodes.get(eid)
        if ep is None or step - ep.step > max_staleness:
            dropped += 1
            log.warning("control: feedback for %s dropped at step %d (%s)", eid, step,
                        "no longer in the log" if ep is None else
                        f"{step - ep.step} steps old > feedback.max_staleness {max_staleness}")
            continue
        groups.setdefault((ep.step, ep.group_id), {})[eid] = value
    ordered = sorted(groups.items())  # oldest first: they go stale first
    deferred = {eid: v for _, values in ordered[max_groups:] for eid, v in values.items()}
    groups = dict(ordered[:max_groups])
    trajs = []
    for (at, group), values in groups.items():
        key = dataclasses.replace(GroupKey.parse(group), replay_step=at)
        for ep in episodes.rows(at):
            if ep.group_id != group:
                continue
            turn = Turn(ep.prompt_ids, ep.response_ids, ep.logprobs,
                        reward=values.get(ep.id, ep.reward), policy_id=ep.policy_id,
                        policy_version=ep.policy_version, finished=ep.finished)
            trajs.append(Trajectory([turn], group_id=key, episode_id=ep.id,
                                    policy_id=ep.policy_id, info={"feedback": ep.id in values}))
    applied = sum(len(v) for v in groups.values())
    if applied:
        log.info("control: feedback for %d episodes joins step %d (%d groups, %d episodes "
                 "trained again)", applied, step, len(groups), len(trajs))
    return trajs, {"control/feedback/applied": float(applied),
                   "control/feedback/dropped": float(dropped),
                   "control/feedback/deferred": float(len(deferred)),
                   "control/feedback/groups": float(len(groups)),
                   "control/feedback/trained": float(len(trajs))}, deferred
