"""Self-play training: learning LM policies play scheduled matches and train on their own turns.

One step of :meth:`LeagueTrainer.run`::

    matches = tournament.next_matches(n)          # scheduler: format, opponents, seats
    played  = runner.run(specs(matches))          # all games at once, generation batched
    tournament.record(results(played), step)      # SQLite records, ratings, win rates
    for learner: engine.train(its trajectories)   # only its own seats; RAE per (env, role)
    tournament.on_step(step, versions)            # snapshots become frozen opponents

Frozen snapshots and scripted baselines never train: the runner only returns trajectories of
policies marked trainable, and only live learners are.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
from typing import Any

import torch

from agentrt.config import SamplingConfig, dump_config
from agentrt.engine import HybridEngine
from agentrt.memory.policy import wire_memories
from agentrt.policies.base import Action, ActRequest
from agentrt.policies.lm import LMPolicy, PromptTemplate
from agentrt.policies.scripted import (
    BargainHeuristic,
    ConnectFourHeuristic,
    KuhnPolicy,
    MinimaxTicTacToe,
    RandomPolicy,
)
from agentrt.progress import StepProgress
from agentrt.rollout.hf import HFRollout
from agentrt.run import RunDir, Timer, load_checkpoint, rng_state, seed_everything, set_rng_state
from agentrt.runner.core import EpisodeRecord, EpisodeRunner, EpisodeSpec
from agentrt.tournaments.report import build_leaderboard, format_leaderboard
from agentrt.tournaments.run_config import TournamentRunConfig
from agentrt.tournaments.session import Tournament
from agentrt.tournaments.types import Entrant, Match, MatchResult, Player
from agentrt.types import Trajectory, Turn, collate

log = logging.getLogger(__name__)

SCRIPTED = {"random": RandomPolicy, "minimax": MinimaxTicTacToe, "connect4": ConnectFourHeuristic,
            "kuhn": KuhnPolicy, "bargain": BargainHeuristic}


class FrozenLM:
    """A frozen copy of a learner's weights at one version (a league snapshot).

    Serves the engine interface :class:`LMPolicy` needs (``policy_id``, ``version``,
    ``tokenizer``, ``cfg``, ``generate``) over its own module through :class:`HFRollout`.
    """

    def __init__(self, engine: HybridEngine, key: str, version: int) -> None:
        self.policy_id = key
        self.version = version
        self.tokenizer = engine.tokenizer
        self.cfg = engine.cfg.model_copy(update={"trainable": False})
        self.model = copy.deepcopy(engine.model).requires_grad_(False).eval()
        self.rollout = HFRollout(self.model, self.tokenizer, engine.cfg.rollout.sampling,
                                 engine.cfg.rollout.batch_size, engine.autocast_dtype)

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig | None = None) -> list:
        return self.rollout.generate(prompts, sampling)

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.model.state_dict().items()}


class Teacher:
    """Behaviour cloning data: a scripted policy plays, and each of its moves becomes a turn
    with the prompt ids the LM policy would have seen and the move as the target response."""

    trainable = True
    version = 0

    def __init__(self, lm: LMPolicy, scripted: Any) -> None:
        self.lm, self.scripted, self.policy_id = lm, scripted, lm.policy_id

    def act(self, requests: list[ActRequest]) -> list[Action]:
        out = []
        eos = self.lm.tokenizer.eos_token_id
        for req, action in zip(requests, self.scripted.act(requests)):
            response = self.lm.encode(action.text) + [eos]
            turn = Turn(self.lm.prompt_ids(req), response, [0.0] * len(response), role=req.agent,
                        policy_id=self.policy_id)
            out.append(Action(action.text, turn))
        return out


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


def rae_regroup(traj: Trajectory) -> Trajectory:
    """RAE baselines last across steps, so their group is (env, seat, policy, opponent policy)
    without snapshot versions: ``"TicTacToe-v0|player_0|lm|vs=lm"`` for every ``lm@k``; a new
    snapshot continues its line's baseline instead of starting cold. (GRPO groups keep the
    versions: they live within one step.)"""
    env_part, agent, pid, _ = traj.group_id.rsplit("|", 3)
    opponents = ",".join(o.split("@")[0] for o in traj.info.get("opponents", []))
    return dataclasses.replace(traj, group_id=f"{env_part}|{agent}|{pid}|vs={opponents}")


def match_seed(seed: int, match_id: str) -> int:
    """Deterministic env seed of a match (same on resume)."""
    return int(hashlib.sha256(f"{seed}:{match_id}".encode()).hexdigest()[:8], 16)


def to_result(match: Match, record: EpisodeRecord) -> MatchResult:
    agents = list(record.seats)  # seat order: player_0, player_1, ...
    score = {"win": 1.0, "draw": 0.5, "loss": 0.0}
    return MatchResult(match, scores=tuple(score[record.results[a]] for a in agents),
                       length=record.num_actions,
                       invalid_moves=tuple(record.invalid[a] for a in agents),
                       info={"ended_by": record.ended_by, "env_seed": record.seed})


class LeagueTrainer:
    """Runs ``agentrt tournament run``: warm start, then matches, training, snapshots, ratings."""

    def __init__(self, cfg: TournamentRunConfig) -> None:
        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.run_dir = RunDir(cfg.run_dir)
        seed_everything(cfg.seed)
        self.engines = {p.id: HybridEngine(p, seed=cfg.seed, workdir=self.run_dir.path,
                                           total_steps=cfg.train.steps) for p in cfg.policies}
        self.learners = [p.id for p in cfg.policies if p.trainable]
        templates = {e.id: PromptTemplate(e.template.first, e.template.turn,
                                          history=e.template.history) for e in cfg.envs}
        self.lm = {pid: LMPolicy(eng, templates) for pid, eng in self.engines.items()}
        # Memory-augmented learners read their bank in every prompt; snapshots never do.
        self.memory = wire_memories(self.lm, {p.id: p.memory for p in cfg.policies},
                                    cfg.memory.banks, self.run_dir.path)
        self.baselines = {b.id: SCRIPTED[b.kind](seed=b.seed) for b in cfg.baselines}
        self.snapshots: dict[str, FrozenLM] = {}
        entrants = [Entrant(p.id, learning=p.trainable, league_role=p.league_role)
                    for p in cfg.policies] + [Entrant(b.id) for b in cfg.baselines]
        self.tournament = Tournament(self.run_dir.path, cfg.schedule, entrants,
                                     [e.id for e in cfg.envs], seed=cfg.seed)
        self.env_kwargs = {e.id: dict(e.kwargs) for e in cfg.envs}
        self.timer = Timer()
        self.step = 0

    # -------------------------------------------------------------- the loop
    def run(self, stop_after: int | None = None) -> dict[str, float]:
        cfg, t = self.cfg, self.tournament
        self.run_dir.write_config(dump_config(cfg))
        last: dict[str, float] = {}
        if not self._resume():
            last = self._warm_start()
        bar = StepProgress(cfg.train.steps, enabled=cfg.progress, start=self.step, label="league")
        try:
            while self.step < cfg.train.steps and not t.done:
                if stop_after is not None and stop_after <= 0:
                    break
                step = self.step + 1
                with self.timer("rollout"):
                    matches = t.next_matches(cfg.train.games_per_step)
                    played = self._play(matches, self._policies(matches))
                t.record([to_result(m, r) for m, r in zip(matches, played.episodes)], step)
                metrics = {**played.metrics}
                with self.timer("train"):
                    for pid in self.learners:
                        metrics |= self._train(pid, [tr for tr in played.trajectories
                                                     if tr.policy_id == pid])
                self.step = step
                versions = {pid: self.engines[pid].version for pid in self.learners}
                self._snapshot(t.on_step(step, versions))
                if step % cfg.eval.every == 0 or step == cfg.train.steps:
                    metrics |= self.evaluate()
                metrics |= self.timer.pop() | {"match/games": float(t.games)}
                self.run_dir.log_metrics(step, metrics)
                last = metrics
                bar.update(step, metrics)
                if cfg.progress and step % max(1, cfg.eval.every) == 0:
                    log.info("%s", t.progress_line())
                if step % cfg.checkpoint.every == 0 or step == cfg.train.steps:
                    self.save()
                if stop_after is not None:
                    stop_after -= 1
        except KeyboardInterrupt:
            log.warning("interrupted at step %d; the last checkpoint is resumable", self.step)
            raise
        finally:
            bar.close()
        self.finish()
        return last

    def _play(self, matches: list[Match], policies: dict[str, Any]) -> Any:
        runner_cfg = self.cfg.runner.model_copy(update={"random_seats": False})
        specs = [EpisodeSpec(m.env, m.keys, seed=match_seed(self.cfg.seed, m.match_id),
                             env_kwargs=self.env_kwargs[m.env]) for m in matches]
        writer = self.memory.on_episode_end if self.memory.policies else None
        return EpisodeRunner(policies, runner_cfg).run(specs, on_episode_end=writer)

    def _policies(self, matches: list[Match]) -> dict[str, Any]:
        needed = {p.key for m in matches for p in m.players}
        out: dict[str, Any] = {}
        for key in needed:
            if key in self.lm:
                out[key] = self.lm[key]
            elif key in self.baselines:
                out[key] = self.baselines[key]
            else:
                out[key] = self._snapshot_policy(key)
        return out

    def _snapshot_policy(self, key: str) -> LMPolicy:
        if key not in self.snapshots:  # version-0 snapshots exist from the start
            pid, version = key.split("@")
            if int(version) != 0 or self.step:
                raise KeyError(f"snapshot {key} was never materialised")
            self.snapshots[key] = FrozenLM(self.engines[pid], key, 0)
        return LMPolicy(self.snapshots[key], self.lm[key.split("@")[0]].templates,
                        trainable=False)

    def _train(self, pid: str, trajs: list[Trajectory]) -> dict[str, float]:
        engine = self.engines[pid]
        if engine.algo.advantage == "rae":
            trajs = [rae_regroup(tr) for tr in trajs]
        data = training_trajectories(trajs)
        if not data:
            return {}
        batch = collate(data, engine.pad_id)
        metrics = engine.prepare(batch)
        metrics |= engine.compute_advantages(batch)
        metrics |= engine.update(batch)
        metrics["reward/mean"] = float(batch.seq_rewards.mean())
        return {f"{k}@{pid}" if len(self.learners) > 1 else k: v for k, v in metrics.items()}

    def _snapshot(self, events: list[Any]) -> None:
        for ev in events:
            player: Player = ev.player
            self.snapshots[player.key] = FrozenLM(self.engines[player.policy_id], player.key,
                                                  player.version)
            for old in ev.dropped:
                self.snapshots.pop(old.key if hasattr(old, "key") else str(old), None)
            if ev.reset:
                log.info("league: %s resets to its initial weights", player.policy_id)
                init = self.snapshots.get(f"{player.policy_id}@0")
                if init is not None:
                    self.engines[player.policy_id].model.load_state_dict(init.state())

    # -------------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, float]:
        """Each learner vs each eval opponent, half the games in each seat (not rated).

        Metrics: ``eval/win_rate_vs_<opp>`` (averaged over seats), ``.../seat<i>``,
        ``eval/draw_rate_vs_<opp>``, ``eval/invalid_rate_vs_<opp>`` (invalid moves per move).
        """
        cfg = self.cfg
        sampling = None
        out: dict[str, float] = {}
        for pid in self.learners:
            policy = self.lm[pid]
            if cfg.eval.greedy:
                sampling = self.engines[pid].cfg.rollout.sampling.model_copy(
                    update={"temperature": 0.0})
            saved, policy.sampling = policy.sampling, sampling
            try:
                for opp in cfg.eval.opponents:
                    out |= self._eval_pair(pid, opp)
            finally:
                policy.sampling = saved
        if len(self.learners) == 1:
            out = {k.replace(f"@{self.learners[0]}", ""): v for k, v in out.items()}
        return out

    def _eval_pair(self, pid: str, opp: str) -> dict[str, float]:
        cfg = self.cfg
        half = cfg.eval.games // 2
        specs = []
        for env in cfg.envs:
            for i in range(2 * half):
                players = (pid, opp) if i < half else (opp, pid)
                specs.append(EpisodeSpec(env.id, players, seed=10_000_019 * (i + 1) + 7,
                                         env_kwargs=dict(env.kwargs)))
        policies = {pid: self.lm[pid], opp: self.baselines[opp]}
        runner_cfg = cfg.runner.model_copy(update={"random_seats": False, "seed": 12345})
        was = self.lm[pid].trainable
        self.lm[pid].trainable = False  # evaluation games never become training data
        try:
            records = EpisodeRunner(policies, runner_cfg).run(specs).episodes
        finally:
            self.lm[pid].trainable = was
        wins = [0.0, 0.0]
        games = [0, 0]
        draws = invalid = moves = 0.0
        for rec in records:
            agent = next(a for a, p in rec.seats.items() if p == pid)
            seat = list(rec.seats).index(agent)
            games[seat] += 1
            wins[seat] += rec.results[agent] == "win"
            draws += rec.results[agent] == "draw"
            invalid += rec.invalid[agent]
            moves += max(1, (rec.num_actions + (seat == 0)) // 2)
        suffix = f"_vs_{opp}@{pid}"
        seat_rates = [w / max(1, g) for w, g in zip(wins, games)]
        return {f"eval/win_rate{suffix}": sum(seat_rates) / 2,
                f"eval/win_rate_seat0{suffix}": seat_rates[0],
                f"eval/win_rate_seat1{suffix}": seat_rates[1],
                f"eval/draw_rate{suffix}": draws / len(records),
                f"eval/invalid_rate{suffix}": invalid / moves}

    # -------------------------------------------------------------- warm start
    def _warm_start(self) -> dict[str, float]:
        """Behaviour cloning of the teacher's legal moves (teaches the action format only),
        then the step-0 evaluation and checkpoint."""
        cfg = self.cfg
        ws = cfg.warm_start
        metrics: dict[str, float] = {}
        for pid in self.learners if ws.steps else []:
            eng = self.engines[pid]
            params = [p for p in eng.model.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(params, lr=ws.lr)
            teacher = Teacher(self.lm[pid], SCRIPTED[ws.teacher](seed=cfg.seed + 1))
            runner_cfg = cfg.runner.model_copy(update={"seed": cfg.seed + 2})
            runner = EpisodeRunner({"teacher": teacher}, runner_cfg)
            bar = StepProgress(ws.steps, enabled=cfg.progress, label=f"warm start {pid}")
            with self.timer("warm_start"):
                for i in range(ws.steps):
                    specs = [EpisodeSpec(e.id, ("teacher",) * len(self._agents(e.id)),
                                         seed=cfg.seed * 1_000_003 + i * ws.games_per_step + j,
                                         env_kwargs=dict(e.kwargs))
                             for e in cfg.envs for j in range(ws.games_per_step)]
                    data = training_trajectories(runner.run(specs).trajectories)
                    metrics = eng.sft_update(collate(data, eng.pad_id), opt)
                    bar.update(i + 1, {"sft/loss": metrics["sft/loss"]})
            bar.close()
            eng.version = 0
            eng.reset_reference()  # KL (when on) is to the warm-started policy
        self.tournament.on_step(0, {pid: self.engines[pid].version for pid in self.learners})
        metrics |= self.evaluate() | self.timer.pop()
        self.run_dir.log_metrics(0, metrics)
        self.save()
        return metrics

    def _agents(self, env_id: str) -> list[str]:
        from agentrt.envs import make_multi

        return list(make_multi(env_id, **self.env_kwargs[env_id]).possible_agents)

    # -------------------------------------------------------------- state
    def save(self) -> None:
        state = {"step": self.step, "rng": rng_state(),
                 "engines": {pid: e.state_dict() for pid, e in self.engines.items()},
                 "snapshots": {k: (s.version, s.state()) for k, s in self.snapshots.items()},
                 "baselines": self.baselines,  # scripted policies carry RNG state
                 "tournament": self.tournament.state_dict(),
                 "memory": self.memory.state_dict()}
        self.run_dir.save_checkpoint(self.step, state, self.cfg.checkpoint.keep)

    def _resume(self) -> bool:
        ckpt = self.run_dir.latest_checkpoint()
        if ckpt is None:
            return False
        state = load_checkpoint(ckpt)
        self.step = state["step"]
        for pid, s in state["engines"].items():
            self.engines[pid].load_state_dict(s)
        for key, (version, weights) in state["snapshots"].items():
            frozen = FrozenLM(self.engines[key.split("@")[0]], key, version)
            frozen.model.load_state_dict(weights)
            self.snapshots[key] = frozen
        self.tournament.load_state_dict(state["tournament"])
        self.memory.load_state_dict(state.get("memory", {}))
        self.baselines = state["baselines"]
        set_rng_state(state["rng"])
        self.run_dir.truncate_metrics(self.step)
        log.warning("resumed from %s (step %d, %d games)", ckpt, self.step,
                    self.tournament.games)
        return True

    def finish(self) -> None:
        """Final leaderboard on the terminal and the HTML report."""
        from agentrt.plot import plot_metrics

        plot_metrics(self.run_dir.read_metrics(), self.run_dir.path / "curves.png")
        results = [r for r, _ in self.tournament.store.results()]
        self.leaderboard_text = format_leaderboard(build_leaderboard(results))
        self.report_path = self.tournament.write_report()
        for pid in self.learners:
            if self.step == self.cfg.train.steps:
                self.engines[pid].save_pretrained(self.run_dir.path / "final_models" / pid)
