"""Deferred rewards: episodes end unscored and a step's samples are scored in one batch.

``Task-v0`` with ``reward=None`` ends its episode with reward 0 and puts what the reward needs in
its final info (``reward_deferred``, ``prompt``, ``response``, ``reward_info``). After the runner
played the step, :func:`score_trajectories` scores every such trajectory with one
:class:`~agentrt.rewards.executors.RewardExecutor` call and credits the value to its last turn,
exactly where the env's reward would have gone, so the advantage math is unchanged.
"""

from __future__ import annotations

from typing import Any

from agentrt.rewards.executors import RewardExecutor, Sample


def deferred_info(prompt: str, response: str, info: dict[str, Any]) -> dict[str, Any]:
    """The final-info entries an env adds when it leaves the reward to the batch."""
    return {"reward_deferred": True, "prompt": prompt, "response": response,
            "reward_info": dict(info)}


def score_trajectories(executor: RewardExecutor, played: Any, prefix: str) -> dict[str, float]:
    """Scores the deferred trajectories of ``played`` (a runner's RunResult) in one batch and
    credits the rewards. A sample's id is ``<prefix>-<i>``, ``i`` its episode's position in
    the step (the episode log's ids: ``s<step>-<i>``).

    A failed sample gets ``info["reward_error"]`` (and 0): the trainer leaves it out of the
    update. Also keeps the episode records' returns and results in step with the rewards.

    Returns:
        ``reward/errors``, ``reward/error_rate`` and the sources' ``reward/<name>/...``.
    """
    trajectories, records = played.trajectories, {r.episode_id: r for r in played.episodes}
    position = {r.episode_id: i for i, r in enumerate(played.episodes)}
    todo = [t for t in trajectories if t.info.get("final_info", {}).get("reward_deferred")]
    samples = [Sample(f"{prefix}-{position[t.episode_id]}", t.info["final_info"]["prompt"],
                      t.info["final_info"]["response"], t.info["final_info"]["reward_info"])
               for t in todo]
    values, errors, metrics = executor.score_batch(samples)
    for traj, value, error in zip(todo, values, errors):
        traj.turns[-1].reward += value
        traj.outcome = traj.info["return"] = traj.reward
        if error is not None:
            traj.info["reward_error"] = error
        record = records.get(traj.episode_id)
        if record is not None and traj.role in record.returns:
            record.returns[traj.role] = traj.reward
            record.results[traj.role] = "solved" if traj.reward > 0 else "failed"
    failed = sum(e is not None for e in errors)
    return metrics | {"reward/errors": float(failed),
                      "reward/error_rate": failed / max(1, len(trajectories))}


def trainable(trajectories: list[Any]) -> list[Any]:
    """The trajectories whose reward did not fail (a failed one is never trained on)."""
    return [t for t in trajectories if "reward_error" not in t.info]
