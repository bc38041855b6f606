"""Objectives: what one policy does with the data of one step, chosen by its config.

- RL (``algorithm.advantage``: gae, grpo, rloo, reinforce++, rae): episodes become training
  sequences (:func:`training_trajectories`), RAE groups drop snapshot versions
  (:func:`rae_regroup`), then the pool prepares, computes advantages once on the whole batch and
  updates.
- Preference (``algorithm.preference_loss``: dpo, ipo, kto, listwise): data rows arrive as
  :class:`~agentrt.runtime.preference.PreferenceExample` (offline data); episodes are turned into pairs,
  ranked by reward within a prompt group (single-agent tasks) or by match outcome (games,
  :func:`outcome_pairs`).
- SFT (:func:`sft`): a warm start's steps of cross-entropy on demonstrations, the same for every
  workload; each hands it its batches (task demonstrations, a scripted teacher's games,
  reference subtask outputs).

A league can mix objectives: each learner's data goes through its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from agentrt.algos.rae import state_key
from agentrt.config.sections import PolicyConfig, SFTConfig
from agentrt.controller.progress import StepProgress
from agentrt.core.types import Trajectory, Turn
from agentrt.runtime.preference import (
    PreferenceExample,
    best_worst_pairs,
    pair_turns,
    tournament_pairs,
)


def training_trajectories(trajs: list[Trajectory]) -> list[Trajectory]:
    """Episodes whose turns extend each other stay one sequence; stateless turns become one
    trajectory each, credited with the return from that turn on (rewards arrive at the end)."""
    out = []
    for tr in trajs:
        extends = all(b.prompt_ids[:len(a.prompt_ids) + len(a.response_ids)]
                      == a.prompt_ids + a.response_ids for a, b in zip(tr.turns, tr.turns[1:]))
        if extends:
            out.append(tr)
            continue
        to_go = 0.0
        returns = []
        for turn in reversed(tr.turns):
            to_go += turn.reward
            returns.append(to_go)
        for turn, g in zip(tr.turns, reversed(returns)):
            single = Turn(turn.prompt_ids, turn.response_ids, turn.logprobs, reward=g,
                          role=turn.role, policy_id=turn.policy_id,
                          policy_version=turn.policy_version, finished=turn.finished)
            out.append(Trajectory([single], group_id=tr.group_id, episode_id=tr.episode_id,
                                  env=tr.env, role=tr.role, policy_id=tr.policy_id,
                                  outcome=tr.outcome, info=tr.info))
    return out


def rae_regroup(traj: Trajectory, per_state: bool = False) -> Trajectory:
    """RAE baselines last across steps, so their group is (env, seat, policy, opponents)
    without snapshot versions: opponents ``("lm",)`` for every ``lm@k`` (whatever the task or
    seed), so a new snapshot continues its line's baseline instead of starting cold. (GRPO
    groups keep the versions: they live within one step.) ``per_state``
    (``algorithm.rae_per_state``): a one-turn row's group is also keyed by its prompt
    (:func:`agentrt.algos.rae.state_key`)."""
    opponents = tuple(o.split("@")[0] for o in traj.info.get("opponents", []))
    group = dataclasses.replace(traj.group_id, task=None, seed=None, opponents=opponents)
    if per_state and len(traj.turns) == 1:
        group = state_key(group, traj.turns[0].prompt_ids)
    return dataclasses.replace(traj, group_id=group)


def outcome_pairs(trajs: list[Trajectory], policy_id: str) -> list[PreferenceExample]:
    """Preference pairs of ``policy_id`` from match outcomes.

    Episodes where both sides were recorded give :func:`tournament_pairs` (the winner's turn k
    over the loser's). The policy's own games against opponents whose turns are not recorded
    (scripted baselines, frozen snapshots, other policies) pair its turns of a won game with its
    turns of a lost game in the same env and seat, each with its own prompt, counted from the
    end: the last move of a won game over the last move of a lost one, the moves before them
    over each other, and so on.

    Why from the end: the moves that decide a game are its last ones (the winning move, the
    blunder before a loss, a forfeiting invalid move). Counted from the start, a short won game's
    winning move was paired with a middle move of a longer lost game. On the pairs of 600
    held-out tic-tac-toe games, 14 DPO checkpoints (seven 50-step league runs) all ranked the
    pairs counted from the end better than those counted from the start (preference accuracy
    0.59 vs 0.55 on average, 0.65 on last moves alone): those labels are less noisy.
    """
    by_episode: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_episode.setdefault(t.episode_id, []).append(t)
    both = [t for ts in by_episode.values() if len(ts) > 1 for t in ts]
    out = tournament_pairs(both, policy_id=policy_id)
    won: dict[tuple, list[Trajectory]] = {}
    lost: dict[tuple, list[Trajectory]] = {}
    for ts in by_episode.values():
        if len(ts) != 1 or ts[0].policy_id != policy_id or ts[0].outcome is None:
            continue
        t = ts[0]
        key = (t.env, t.role)
        if t.info.get("result") == "win":
            won.setdefault(key, []).append(t)
        elif t.info.get("result") == "loss":
            lost.setdefault(key, []).append(t)
    for key, wins in won.items():
        for w, lo in zip(wins, lost.get(key, [])):
            out += [pair_turns(a, b) for a, b in zip(reversed(w.turns), reversed(lo.turns))
                    if a.response_ids and b.response_ids and a.response_ids != b.response_ids]
    return out


def preference_examples(cfg: PolicyConfig, data: list[Any]) -> list[PreferenceExample]:
    """The policy's preference examples from a step's data (rows, or episodes to pair)."""
    if not data or isinstance(data[0], PreferenceExample):
        return list(data)
    if any(t.info.get("opponents") for t in data):  # games: pairs from outcomes
        return outcome_pairs(data, cfg.id)
    return best_worst_pairs(data)  # one prompt, several samples: best against worst


def learn(pool: Any, pid: str, cfg: PolicyConfig, data: list[Any], pairs: str = "all"
          ) -> dict[str, float]:
    """One step of ``pid``'s objective on ``data`` in its pool; metrics (empty: no step).

    ``pairs``: which pairs of a ranked list a preference loss uses ("all" or "best_worst").
    """
    algo = cfg.algorithm
    if algo.is_preference:
        examples = preference_examples(cfg, data)
        metrics = {"pref/pairs": float(len(examples))}
        # Every group tied / no decided game, or fewer pairs than data-parallel workers (each
        # needs one): nothing to learn this step.
        if examples and len(examples) >= pool.num_workers:
            metrics |= pool.preference_step(examples, pairs, adapter=pid)
        return metrics
    trajs = training_trajectories(list(data))
    if algo.advantage == "rae":
        trajs = [rae_regroup(t, algo.rae_per_state) for t in trajs]
    if not trajs:
        return {}
    return pool.train(trajs, adapter=pid)


def sft(ctl: Any, pid: str, batch: Callable[[int], list[Trajectory]], cfg: SFTConfig,
        steps: int, progress: bool, label: str) -> dict[str, float]:
    """The SFT warm start of policy ``pid``: ``steps`` steps on ``batch(i)`` (trajectories whose
    loss mask marks the demonstrated tokens), then the warm start ends (RL starts from version 0;
    KL, when on, is to the warm-started policy). Returns the last step's metrics."""
    bar = StepProgress(steps, enabled=progress, label=label)
    metrics: dict[str, float] = {}
    for i in range(steps):
        metrics = ctl.sft_step(pid, batch(i), cfg)
        bar.update(i + 1, {"sft/loss": metrics["sft/loss"]})
    bar.close()
    ctl.end_sft(pid)
    return metrics
