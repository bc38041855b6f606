"""The episode runner: plays many episodes at once and returns token-exact trajectories.

Each tick, every live episode waits on the policy of its agent to move; the requests of all
episodes waiting on the same policy go to that policy in one ``act`` call (one batched generate
for an LM policy). Finished episodes are replaced from the queue until all specs are played.

    runner = EpisodeRunner({"lm": LMPolicy(engine), "random": RandomPolicy(seed=1)},
                           RunnerConfig(concurrency=256))
    result = runner.run(specs("TicTacToe-v0", ("lm", "random"), n=1024, seed=0))
    result.trajectories   # trainable policies' turns only, one Trajectory per (episode, agent)
    result.episodes       # EpisodeRecord per spec: seats, returns, results, invalid counts
    result.metrics        # match/..., reward/..., rollout/..., timing_s/..., perf/...

Outcomes: ``Trajectory.outcome`` is the score 1 (win), 0.5 (draw), 0 (loss) in multi-agent games
(win = strictly highest return) and the return in single-agent envs; ``info["result"]`` names it.
An invalid action adds ``invalid_penalty`` to that turn; in "end" mode (or after ``max_retries``
invalid actions in a row in "retry" mode) the offender forfeits: it loses, the others win. The
turn limit ends a game as a truncated draw.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

from pydantic import Field

from agentrt.envs.registration import make_multi
from agentrt.core.errors import AgentrtError, ConfigError
from agentrt.policies.base import Action, ActRequest, Policy, as_policy
from agentrt.runner.joint import act_all
from agentrt.runner.record import EpisodeRecord, episode_results
from agentrt.runner.vector import can_vectorize, run_vectorized
from agentrt.core.schema import MAX_SEED, ConfigModel
from agentrt.core.types import GroupKey, Trajectory, Turn


class RunnerConfig(ConfigModel):
    """Episode runner settings (frozen; unknown keys rejected)."""

    concurrency: int = Field(256, gt=0, description="Episodes played at once.")
    random_seats: bool = Field(True, description="Shuffle players over seats per episode.")
    invalid_action: Literal["end", "retry"] = Field(
        "end", description="An invalid action ends the game (offender forfeits) or is asked again.")
    invalid_penalty: float = Field(-1.0, description="Reward added to an invalid action's turn.")
    max_retries: int = Field(2, ge=0, description="'retry': invalid actions in a row allowed "
                                                  "before the offender forfeits.")
    max_turns: int = Field(100, gt=0, description="Actions per episode before a truncated draw.")
    seed: int = Field(0, ge=0, le=MAX_SEED,
                      description="Seeds seat shuffling and default episode seeds.")
    record_text: bool = Field(False, description="Keep observation text in Turn.info (logs).")
    vectorize: bool = Field(True, description="Use the numpy fast path when every policy is "
                                              "scripted and the env has a vector game.")
    policy_errors: Literal["raise", "record"] = Field(
        "raise", description="A policy whose act() raises stops the run ('raise'), or its "
                             "episodes record the error and go on ('record': the env's "
                             "on_policy_error hook if it has one, else the episode ends).")


ROUTED = "*"  # a seat bound to a policy when it first acts (EpisodeRunner's ``route``)


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to play.

    Attributes:
        env: Registered env id.
        players: Policy ids, one per seat of the env (shuffled over seats if random_seats);
            :data:`ROUTED` ("*") leaves a seat to the runner's ``route`` when it first acts
            (a seat that never acts is left out of the record).
        seed: Env seed (default: derived from the runner seed and the spec's position).
        env_kwargs: Keyword arguments of ``make``.
        options: Passed to ``env.reset(options=...)``.
        group: What its trajectories' baseline groups share besides env, role and policy (the
            :class:`~agentrt.core.types.GroupKey`'s ``task``): the prompt or task, e.g. "ex3"
            (default: the seed for single-agent envs whose seed fixes the task, else the
            opponents' policy ids).
        episode_id: The record's ``episode_id`` (default: 128 random bits as hex). A league
            passes its match id, so a replayed episode keeps its id (memory writes key on it).
    """

    env: str
    players: tuple[str, ...]
    seed: int | None = None
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] | None = None
    group: str | None = None
    episode_id: str | None = None


def specs(env: str, players: Sequence[str], n: int, seed: int = 0, **kwargs: Any
          ) -> list[EpisodeSpec]:
    """``n`` specs of ``env`` with seeds ``seed, seed+1, ...`` (kwargs go to EpisodeSpec)."""
    return [EpisodeSpec(env, tuple(players), seed + i, **kwargs) for i in range(n)]


@dataclass
class RunResult:
    trajectories: list[Trajectory]
    episodes: list[EpisodeRecord]
    metrics: dict[str, float]


class _Episode:
    """Mutable state of one live episode."""

    __slots__ = ("spec", "seed", "env", "key", "id", "seats", "seat_of", "turns", "counts",
                 "returns", "pending", "invalid", "streak", "num_actions", "ended_by", "forfeit")

    def __init__(self, spec: EpisodeSpec, seed: int, env: Any, key: str,
                 seats: dict[str, str]) -> None:
        self.spec, self.seed, self.env, self.key, self.seats = spec, seed, env, key, seats
        # 128 random bits as hex, like uuid4().hex, at a fifth of its cost (256 episodes a step)
        self.id = spec.episode_id or os.urandom(16).hex()
        agents = list(env.possible_agents)
        self.seat_of = {a: i for i, a in enumerate(agents)}
        self.turns: dict[str, list[Turn]] = {a: [] for a in agents}
        self.counts = dict.fromkeys(agents, 0)
        self.returns = dict.fromkeys(agents, 0.0)
        self.pending = dict.fromkeys(agents, 0.0)
        self.invalid = dict.fromkeys(agents, 0)
        self.streak = 0
        self.num_actions = 0
        self.ended_by: str | None = None
        self.forfeit: str | None = None

    def credit(self, agent: str, reward: float) -> None:
        self.returns[agent] += reward
        turns = self.turns[agent]
        if turns:
            turns[-1].reward += reward
        else:
            self.pending[agent] += reward


class EpisodeRunner:
    """Plays :class:`EpisodeSpec` lists with a set of policies (see module docstring).

    Args:
        policies: ``{policy_id: Policy or callable}``; ids are what specs name in ``players``.
        config: Runner settings.
        route: ``route(env, agent) -> policy_id`` binds a :data:`ROUTED` seat when its agent
            first acts (the decomposer's router).
        env_pool: Finished envs by kind, reset and reused by later episodes; pass one dict to
            every runner of a loop to keep them across its steps (None: this runner's own).
    """

    def __init__(self, policies: Mapping[str, Any], config: RunnerConfig | None = None,
                 route: Callable[[Any, str], str] | None = None,
                 env_pool: dict[str, list[Any]] | None = None) -> None:
        if not policies:
            raise ConfigError("the runner needs at least one policy")
        self.policies: dict[str, Policy] = {k: as_policy(v) for k, v in policies.items()}
        self.cfg = config or RunnerConfig()
        self.route = route
        self.rng = random.Random(self.cfg.seed)
        self._pool: dict[str, list[Any]] = {} if env_pool is None else env_pool
        # a run's specs share their kwargs (one object): its JSON once, not once per episode;
        # the object is held, so no other takes its id while the entry lives
        self._kwargs_json: dict[int, tuple[Any, str]] = {}

    # ------------------------------------------------------------------ public
    def run(self, episodes: Sequence[EpisodeSpec],
            on_episode_end: Callable[[EpisodeRecord], None] | None = None) -> RunResult:
        """Plays every spec; returns trajectories, records (in spec order) and metrics.

        Args:
            episodes: What to play.
            on_episode_end: Called with each record as soon as its episode ends (e.g. to write
                a memory bank between episodes); on the vectorized fast path, after the run.
        """
        self._validate(episodes)
        self._kwargs_json.clear()  # kwargs may have changed between runs
        start = time.perf_counter()
        stats = _Stats()
        if can_vectorize(self, episodes):
            done = run_vectorized(self, episodes, stats)
            for record in done if on_episode_end is not None else ():
                on_episode_end(record)
            metrics = summarize(done)
            metrics.update(stats.metrics(time.perf_counter() - start, len(done), []))
            return RunResult([], done, metrics)
        queue = deque(enumerate(episodes))
        records: list[EpisodeRecord | None] = [None] * len(episodes)
        trajectories: list[Trajectory] = []
        active: list[tuple[int, _Episode]] = []
        while queue or active:
            while queue and len(active) < self.cfg.concurrency:
                i, spec = queue.popleft()
                active.append((i, self._start(i, spec)))
            self._tick([ep for _, ep in active], stats)
            live = []
            for i, ep in active:
                if ep.ended_by is None:
                    live.append((i, ep))
                    continue
                record = self._finish(ep, trajectories)
                records[i] = record
                if on_episode_end is not None:
                    on_episode_end(record)
            active = live
        done = [r for r in records if r is not None]
        metrics = summarize(done)
        metrics.update(stats.metrics(time.perf_counter() - start, len(done), trajectories))
        return RunResult(trajectories, done, metrics)

    # ------------------------------------------------------------------ episode life
    def _validate(self, episodes: Sequence[EpisodeSpec]) -> None:
        for spec in episodes:
            unknown = [p for p in spec.players if p not in self.policies
                       and not (p == ROUTED and self.route is not None)]
            if unknown:
                raise ConfigError(f"episode of {spec.env!r} names unknown policy {unknown[0]!r}; "
                                  f"known: {', '.join(sorted(self.policies))}")

    def _start(self, index: int, spec: EpisodeSpec) -> _Episode:
        kwargs = spec.env_kwargs
        hit = self._kwargs_json.get(id(kwargs))
        if hit is None:
            text = json.dumps(dict(kwargs), sort_keys=True, default=str)
            hit = self._kwargs_json[id(kwargs)] = (kwargs, text)
        key = spec.env + hit[1]  # the env pool's key: env and kwargs
        pool = self._pool.setdefault(key, [])
        env = pool.pop() if pool else make_multi(spec.env, **dict(spec.env_kwargs))
        agents = list(env.possible_agents)
        if len(spec.players) != len(agents):
            raise ConfigError(f"episode of {spec.env!r} names {len(spec.players)} players but "
                              f"the env has {len(agents)} seats")
        players = list(spec.players)
        if self.cfg.random_seats and len(players) > 1:
            self.rng.shuffle(players)
        seed = spec.seed if spec.seed is not None else self.cfg.seed * 1_000_003 + index
        env.reset(seed=seed, options=dict(spec.options) if spec.options else None)
        return _Episode(spec, seed, env, key, dict(zip(agents, players)))

    def _tick(self, active: list[_Episode], stats: _Stats) -> None:
        waiting: dict[str, list[tuple[_Episode, ActRequest]]] = defaultdict(list)
        for ep in active:
            agent = ep.env.agent_selection
            turns = ep.turns[agent]
            req = ActRequest(ep.env, ep.id, ep.spec.env, agent, ep.seat_of[agent],
                             ep.counts[agent], ep.streak, turns[-1] if turns else None)
            waiting[self._bind(ep, agent)].append((ep, req))
        for pid, items, actions, seconds in act_all(self.policies, waiting):
            if isinstance(actions, Exception):
                if self.cfg.policy_errors == "raise":
                    raise actions
                for ep, req in items:
                    _policy_error(ep, req.agent, f"{type(actions).__name__}: {actions}")
                continue
            stats.policy_call(pid, len(items), seconds)
            if len(actions) != len(items):
                raise AgentrtError(f"policy {pid!r} returned {len(actions)} actions for "
                                   f"{len(items)} requests; act() must answer each request")
            t0 = time.perf_counter()
            for (ep, req), action in zip(items, actions):
                self._apply(ep, req, action if isinstance(action, Action) else Action(action))
            stats.env_s += time.perf_counter() - t0

    def _bind(self, ep: _Episode, agent: str) -> str:
        """The policy of ``agent``: its seat's, or the router's pick for a :data:`ROUTED` seat."""
        pid = ep.seats[agent]
        if pid == ROUTED:
            assert self.route is not None
            pid = self.route(ep.env, agent)
            if pid not in self.policies:
                raise ConfigError(f"the router picked unknown policy {pid!r}; known: "
                                  f"{', '.join(sorted(self.policies))}")
            ep.seats[agent] = pid
        return pid

    def _apply(self, ep: _Episode, req: ActRequest, action: Action) -> None:
        agent, env, cfg = req.agent, ep.env, self.cfg
        ep.num_actions += 1
        if action.error is not None and cfg.policy_errors == "record":
            _policy_error(ep, agent, action.error)
            return
        if action.truncate:
            ep.ended_by = "context"
            return
        if action.turn is not None:
            turn = action.turn
            turn.role, turn.policy_id = agent, ep.seats[agent]
            turn.reward += ep.pending[agent]
            ep.pending[agent] = 0.0
            if cfg.record_text:
                turn.info["observation"] = req.observation
            ep.turns[agent].append(turn)
        ep.counts[agent] += 1
        env.step(action.text)
        for a, r in env.rewards.items():
            if r:
                ep.credit(a, float(r))
        if env.infos[agent].get("invalid_action"):
            ep.invalid[agent] += 1
            ep.credit(agent, cfg.invalid_penalty)
            ep.streak += 1
            if cfg.invalid_action == "end" or ep.streak > cfg.max_retries:
                ep.ended_by, ep.forfeit = "invalid", agent
                return
        else:
            ep.streak = 0
        if env.done:
            ep.ended_by = "truncated" if any(env.truncations.values()) else "terminated"
        elif ep.num_actions >= cfg.max_turns:
            ep.ended_by = "turn_limit"

    def _finish(self, ep: _Episode, out: list[Trajectory]) -> EpisodeRecord:
        if ROUTED in ep.seats.values():  # seats that never acted are not part of the episode
            ep.seats = {a: p for a, p in ep.seats.items() if p != ROUTED}
            ep.returns = {a: r for a, r in ep.returns.items() if a in ep.seats}
        results = episode_results(ep.returns, ep.forfeit, str(ep.ended_by))
        final = {a: {k: v for k, v in ep.env.infos.get(a, {}).items() if k != "legal_actions"}
                 for a in ep.returns}
        versions = {a: int(getattr(self.policies[p], "version", 0)) for a, p in ep.seats.items()}
        record = EpisodeRecord(ep.id, ep.spec.env, ep.seed, dict(ep.seats), dict(ep.returns),
                               results, ep.num_actions, dict(ep.invalid), str(ep.ended_by),
                               final, versions)
        for agent, turns in ep.turns.items():
            pid = ep.seats.get(agent, ROUTED)  # an agent with turns has acted, so is bound
            if turns and self.policies[pid].trainable:
                out.append(self._trajectory(ep, agent, pid, turns, record))
        self._pool.setdefault(ep.key, []).append(ep.env)
        return record

    def _trajectory(self, ep: _Episode, agent: str, pid: str, turns: list[Turn],
                    record: EpisodeRecord) -> Trajectory:
        opponents = [ep.seats[a] for a in ep.seats if a != agent]
        kwargs = ep.key[len(ep.spec.env):]  # the kwargs' JSON (_start)
        env_id = ep.spec.env if kwargs == "{}" else f"{ep.spec.env}{kwargs}"
        if ep.spec.group is not None:
            group = GroupKey(env_id, agent, pid, task=ep.spec.group)
        elif getattr(ep.env, "group_by_seed", False):
            group = GroupKey(env_id, agent, pid, seed=ep.seed)
        else:
            group = GroupKey(env_id, agent, pid, opponents=tuple(opponents))
        result = record.results[agent]
        score = {"win": 1.0, "draw": 0.5, "loss": 0.0}
        outcome = ep.returns[agent] if len(ep.seats) == 1 else score[result]
        info = {"seat": ep.seat_of[agent], "result": result, "return": ep.returns[agent],
                "opponents": opponents, "env_seed": ep.seed, "ended_by": record.ended_by,
                "invalid_actions": ep.invalid[agent], "final_info": record.final_infos[agent]}
        return Trajectory(turns=turns, group_id=group,
                          episode_id=ep.id, env=ep.spec.env, role=agent, policy_id=pid,
                          outcome=outcome, info=info)


def _policy_error(ep: _Episode, agent: str, message: str) -> None:
    """A policy raised instead of acting for ``agent``: the env's ``on_policy_error`` records it
    and the episode goes on; an env without that hook ends the episode ("policy_error")."""
    hook = getattr(ep.env, "on_policy_error", None)
    if hook is None:
        ep.ended_by = "policy_error"
        return
    hook(agent, message)
    for a, r in ep.env.rewards.items():
        if r:
            ep.credit(a, float(r))
    if ep.env.done:
        ep.ended_by = "terminated"


class _Stats:
    """Call counts and timings of one run."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = defaultdict(int)
        self.requests: dict[str, int] = defaultdict(int)
        self.policy_s: dict[str, float] = defaultdict(float)
        self.env_s = 0.0

    def policy_call(self, pid: str, n: int, seconds: float) -> None:
        self.calls[pid] += 1
        self.requests[pid] += n
        self.policy_s[pid] += seconds

    def metrics(self, seconds: float, episodes: int, trajs: list[Trajectory]) -> dict[str, float]:
        out: dict[str, float] = {"timing_s/rollout": seconds, "timing_s/env": self.env_s}
        for pid in self.calls:
            out[f"rollout/calls/{pid}"] = float(self.calls[pid])
            out[f"rollout/requests/{pid}"] = float(self.requests[pid])
            out[f"rollout/batch_mean/{pid}"] = self.requests[pid] / self.calls[pid]
            out[f"timing_s/policy/{pid}"] = self.policy_s[pid]
        out["rollout/trajectories"] = float(len(trajs))
        out["rollout/response_tokens"] = float(sum(len(t.response_ids) for tr in trajs
                                                   for t in tr.turns))
        out["perf/episodes_per_s"] = episodes / seconds if seconds > 0 else 0.0
        out["perf/actions_per_s"] = sum(self.requests.values()) / seconds if seconds > 0 else 0.0
        return out


def summarize(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Outcome metrics of a set of episodes (call it per env or opponent to split them).

    Returns ``match/episodes``, ``match/draw_rate``, ``match/truncated_rate``,
    ``match/forfeit_rate``, ``match/invalid_rate`` (invalid actions / actions),
    ``match/turns_mean``, ``match/seat_win_rate/<seat>``, ``match/win_rate/<policy>``,
    ``reward/mean/<policy>`` and, for single-agent envs, ``reward/solved_rate/<policy>``.
    """
    n = len(records)
    if n == 0:
        return {"match/episodes": 0.0}
    actions = sum(r.num_actions for r in records)
    invalid = sum(sum(r.invalid.values()) for r in records)
    multi = [r for r in records if len(r.seats) > 1]
    out = {"match/episodes": float(n),
           "match/invalid_actions": float(invalid),
           "match/invalid_rate": invalid / actions if actions else 0.0,
           "match/forfeit_rate": sum(r.ended_by == "invalid" for r in records) / n,
           "match/truncated_rate": sum(r.truncated for r in records) / n,
           "match/turns_mean": actions / n}
    if multi:
        out["match/draw_rate"] = sum(all(v == "draw" for v in r.results.values())
                                     for r in multi) / len(multi)
    seat_wins: dict[int, int] = defaultdict(int)
    played: dict[str, int] = defaultdict(int)
    wins: dict[str, int] = defaultdict(int)
    solved: dict[str, int] = defaultdict(int)
    returns: dict[str, float] = defaultdict(float)
    for r in records:
        for seat, (agent, pid) in enumerate(r.seats.items()):
            played[pid] += 1
            returns[pid] += r.returns[agent]
            wins[pid] += r.results[agent] == "win"
            solved[pid] += r.results[agent] == "solved"
            if len(r.seats) > 1:
                seat_wins[seat] += r.results[agent] == "win"
    for seat, w in sorted(seat_wins.items()):
        out[f"match/seat_win_rate/{seat}"] = w / len(multi)
    for pid, k in played.items():
        out[f"reward/mean/{pid}"] = returns[pid] / k
        if multi:
            out[f"match/win_rate/{pid}"] = wins[pid] / k
        if len(multi) < n:
            out[f"reward/solved_rate/{pid}"] = solved[pid] / k
    return out
