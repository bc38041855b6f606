"""The runner's fast path: scripted policies on a vectorized game (see ``agentrt.envs.vector``).

Same semantics as the per-episode loop (random seats from the runner's generator, invalid-action
penalty and end/retry, turn limit, records and metrics); only the inner loop is numpy over a block
of ``concurrency`` games. Used when every spec is the same env with no kwargs or options, the env
class has ``vector_game`` and every policy involved has ``act_vector``.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from agentrt.core.errors import ConfigError
from agentrt.runner.record import EpisodeRecord, episode_results

if TYPE_CHECKING:
    from agentrt.runner.core import EpisodeSpec

_ENDS = ("", "terminated", "invalid", "turn_limit")


def can_vectorize(runner: Any, episodes: Sequence[EpisodeSpec]) -> bool:
    """Whether :func:`run_vectorized` can play ``episodes`` with ``runner``'s policies."""
    from agentrt.envs.registration import ENVS

    if not episodes or not runner.cfg.vectorize:
        return False
    env = episodes[0].env
    if any(s.env != env or s.env_kwargs or s.options for s in episodes):
        return False
    entry = ENVS.get(env).entry_point
    if getattr(entry, "vector_game", None) is None:
        return False
    pids = {p for s in episodes for p in s.players}
    return all(hasattr(runner.policies[p], "act_vector") and not runner.policies[p].trainable
               for p in pids)


def run_vectorized(runner: Any, episodes: Sequence[EpisodeSpec], stats: Any
                   ) -> list[EpisodeRecord]:
    """Plays ``episodes`` in blocks of ``runner.cfg.concurrency`` games; returns their records."""
    from agentrt.envs.registration import ENVS

    game = ENVS.get(episodes[0].env).entry_point.vector_game()
    records: list[EpisodeRecord] = []
    size = runner.cfg.concurrency
    for start in range(0, len(episodes), size):
        block = episodes[start:start + size]
        records += _run_block(runner, game, block, start, stats)
    return records


def _run_block(runner: Any, game: Any, block: Sequence[EpisodeSpec], offset: int,
               stats: Any) -> list[EpisodeRecord]:
    cfg = runner.cfg
    agents = list(game.possible_agents)
    pids = sorted({p for s in block for p in s.players})
    n, m = len(block), len(agents)
    seat_pid = np.zeros((n, m), dtype=np.int64)
    for i, spec in enumerate(block):
        players = list(spec.players)
        if len(players) != m:
            raise ConfigError(f"episode of {spec.env!r} names {len(players)} players but the "
                              f"env has {m} seats")
        if cfg.random_seats and m > 1:
            runner.rng.shuffle(players)
        seat_pid[i] = [pids.index(p) for p in players]
    game.reset(n)
    st = {"returns": np.zeros((n, m)), "invalid": np.zeros((n, m), dtype=np.int64),
          "actions": np.zeros(n, dtype=np.int64), "streak": np.zeros(n, dtype=np.int64),
          "end": np.zeros(n, dtype=np.int64), "forfeit": np.full(n, -1)}
    active = np.arange(n)
    while active.size:
        movers = seat_pid[active, game.to_move[active]]
        for k, pid in enumerate(pids):
            sub = active[movers == k]
            if sub.size:
                _move(runner, game, pid, sub, st, stats)
        active = active[st["end"][active] == 0]
    return [_record(block[i], i, offset + i, agents, pids, seat_pid[i], st, cfg.seed)
            for i in range(n)]


def _move(runner: Any, game: Any, pid: str, sub: np.ndarray, st: dict[str, np.ndarray],
          stats: Any) -> None:
    cfg = runner.cfg
    seat = game.to_move[sub].copy()
    actions = runner.policies[pid].act_vector(game, sub, game.legal_mask(sub))
    stats.policy_call(pid, len(sub), 0.0)
    rewards, done, invalid = game.step(sub, actions)
    st["returns"][sub] += rewards
    st["actions"][sub] += 1
    bad = sub[invalid]
    st["invalid"][bad, seat[invalid]] += 1
    st["returns"][bad, seat[invalid]] += cfg.invalid_penalty
    st["streak"][sub] = np.where(invalid, st["streak"][sub] + 1, 0)
    forfeit = invalid & ((cfg.invalid_action == "end") | (st["streak"][sub] > cfg.max_retries))
    st["forfeit"][sub[forfeit]] = seat[forfeit]
    st["end"][sub[forfeit]] = 2
    finished = done & ~forfeit
    st["end"][sub[finished]] = 1
    limit = (st["end"][sub] == 0) & (st["actions"][sub] >= cfg.max_turns)
    st["end"][sub[limit]] = 3


def _record(spec: EpisodeSpec, i: int, index: int, agents: list[str], pids: list[str],
            seats: np.ndarray, st: dict[str, np.ndarray], runner_seed: int) -> EpisodeRecord:
    returns = {a: float(st["returns"][i, j]) for j, a in enumerate(agents)}
    forfeit = agents[st["forfeit"][i]] if st["forfeit"][i] >= 0 else None
    ended_by = _ENDS[int(st["end"][i])]
    seed = spec.seed if spec.seed is not None else runner_seed * 1_000_003 + index
    return EpisodeRecord(
        episode_id=spec.episode_id or uuid.uuid4().hex, env=spec.env, seed=seed,
        seats={a: pids[int(seats[j])] for j, a in enumerate(agents)}, returns=returns,
        results=episode_results(returns, forfeit, ended_by), num_actions=int(st["actions"][i]),
        invalid={a: int(st["invalid"][i, j]) for j, a in enumerate(agents)}, ended_by=ended_by,
        final_infos={a: {} for a in agents}, policy_versions=dict.fromkeys(agents, 0))
