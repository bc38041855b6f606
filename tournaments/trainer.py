"""``agentrt tournament run``: learning LM policies play scheduled matches and train on them.

The workload of the controller loop (:mod:`agentrt.controller.loop`) for leagues and tournaments::

    matches = tournament.next_matches(n)          # scheduler: format, opponents, seats, roles
    played  = runner.run(specs(matches))          # (controller) all games at once, batched
    tournament.record(results(played), step)      # SQLite records, ratings, win rates
    learn(its own seats' trajectories)            # (controller) each learner's objective
    tournament.on_step(step, versions)            # snapshots become frozen opponents

Every LM policy lives in a pool of the controller; frozen snapshots are adapters (LoRA) or CPU
weights (full weights) in the pool of their source, never model copies. Scripted baselines
never train: the runner only returns trajectories of policies marked trainable.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import asdict
from typing import Any

from agentrt.memory.policy import wire_memories
from agentrt.policies.base import Action, ActRequest
from agentrt.policies.lm import LMPolicy
from agentrt.policies.scripted import load_scripted_state, scripted_factory, scripted_state
from agentrt.tournaments.exploit_games import (best_response_moves, exploit_metrics,
                                               mixture_metrics)
from agentrt.tournaments.exploiter import train_exploiter
from agentrt.tournaments.report import (
    SEAT_RESULTS,
    build_leaderboard,
    format_leaderboard,
    format_seat_table,
    seat_table,
)
from agentrt.tournaments.run_config import TournamentRunConfig
from agentrt.tournaments.session import Tournament
from agentrt.tournaments.records import MatchStore
from agentrt.tournaments.types import Match, MatchResult

from agentrt.config.sections import SFTConfig
from agentrt.controller import objectives
from agentrt.controller.episodes import EPISODES
from agentrt.controller.identity import read_identity
from agentrt.controller.launch import Run
from agentrt.controller.loop import Controller, greedy
from agentrt.controller.objectives import outcome_pairs, training_trajectories
from agentrt.controller.workload import Workload
from agentrt.core.types import Turn
from agentrt.runner.core import EpisodeRunner, EpisodeSpec, RunResult
from agentrt.runner.record import EpisodeRecord
from agentrt.runtime.preference import PreferenceExample

log = logging.getLogger(__name__)
_OUTCOMES = ("win", "draw", "loss")  # eval metrics: eval/<outcome>_rate_vs_<opp>[_seat<i>]



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
        actions = self.scripted.act(requests)  # the tick's prompts and moves: a call each
        moves = self.lm.encode_many([a.text for a in actions])
        prompts, chats = self.lm.render(requests)
        for req, action, prompt, chat, move in zip(requests, actions, prompts, chats, moves):
            response = move + [eos]
            turn = Turn(prompt, response, [0.0] * len(response), role=req.agent,
                        policy_id=self.policy_id, info={"action": action.text})
            if chat is not None:  # the next prompt extends this conversation
                turn.info["chat"] = chat
            out.append(Action(action.text, turn))
        return out


def match_seed(seed: int, match_id: str) -> int:
    """Deterministic env seed of a match (same on resume)."""
    return int(hashlib.sha256(f"{seed}:{match_id}".encode()).hexdigest()[:8], 16)


def to_result(match: Match, record: EpisodeRecord) -> MatchResult:
    agents = list(record.seats)  # seat order: player_0, player_1, ...
    score = {"win": 1.0, "draw": 0.5, "loss": 0.0, "solved": 1.0, "failed": 0.0}
    return MatchResult(match, scores=tuple(score[record.results[a]] for a in agents),
                       length=record.num_actions,
                       invalid_moves=tuple(record.invalid[a] for a in agents),
                       info={"ended_by": record.ended_by, "env_seed": record.seed})


def refresh_best_responses(cfg: TournamentRunConfig, baselines: dict[str, Any],
                           lm: dict[str, LMPolicy], step: int) -> dict[str, float]:
    """Each ``kind: best_response`` baseline due at ``step`` recomputes its table: the exact
    best response to its target's greedy play now (scored at the sampling temperature, as the
    exploitability eval does). Metrics: the size of each table recomputed."""
    out = {}
    for b in cfg.baselines:
        if b.target is None or step % b.every:
            continue
        moves: dict[str, list[str]] = {}
        for env in cfg.envs:
            moves |= best_response_moves(env.id, dict(env.kwargs), lm[b.target])
        baselines[b.id].set_moves(moves)
        out[f"league/best_response_states/{b.id}"] = float(len(moves))
    return out


class LeagueWorkload(Workload):
    """Matches of a tournament for the controller loop (see the module docstring)."""

    label = "league"
    outputs = ("matches.sqlite*", "report.html", SEAT_RESULTS, "final_models", "memory",
               f"{EPISODES}*")  # + RunDir.outputs
    live = ("train.games_per_step",)  # + each policy's sampling and LR, the shared fields
    refused = {"inject": "a league plays scheduled matches; it has no prompts to inject",
               "feedback": "a match's reward is its outcome (win, draw, loss), known when it "
               "ends; there is no late reward to give"}

    def __init__(self, cfg: TournamentRunConfig) -> None:
        super().__init__(cfg)
        self.runner = cfg.runner.model_copy(update={"random_seats": False})
        self.learners = [p.id for p in cfg.policies if p.trainable]
        self.templates = {e.id: e.template.prompt() for e in cfg.envs}
        self.env_kwargs = {e.id: dict(e.kwargs) for e in cfg.envs}
        self.seats = {k: list(v) for k, v in cfg.env_seats().items()}
        self.roles = {p.id: p.roles for p in cfg.policies} | {b.id: b.roles for b in cfg.baselines}
        self.baselines = {b.id: scripted_factory(b.kind)(seed=b.seed) for b in cfg.baselines}
        self.policy_cfgs = {p.id: p for p in cfg.policies}
        self.heldout: dict[str, list[PreferenceExample]] = {}  # preference learners' eval pairs
        self.matches: list[Match] = []

    def start(self, ctl: Controller) -> None:
        cfg = self.cfg
        self.ctl = ctl
        self.lm = {p.id: LMPolicy(ctl.handle(p.id), self.templates) for p in cfg.policies}
        # Memory-augmented learners read their bank in every prompt; snapshots never do.
        # Record ids and tags name the run by its folder's run_uid (run.json): a replay writes
        # the same ids; another run sharing a Redis bank, even of the same config, other ones.
        identity = read_identity(ctl.run_dir.path) or {}
        self.memory = wire_memories(self.lm, {p.id: p.memory for p in cfg.policies},
                                    cfg.memory.banks, ctl.run_dir.path,
                                    run=str(identity.get("run_uid", "")))
        self.frozen: dict[str, LMPolicy] = {}
        self.tournament = Tournament(ctl.run_dir.path, cfg.schedule, cfg.entrants(),
                                     [e.id for e in cfg.envs], seed=cfg.seed, seats=self.seats)

    def make_players(self, ctl: Controller) -> None:
        """After a live change: each policy's player made again from its new config, with its
        memory (frozen opponents keep theirs)."""
        self.policy_cfgs = {p.id: p for p in self.cfg.policies}
        self.lm = {pid: LMPolicy(ctl.handle(pid), self.templates, memory=lm.memory)
                   for pid, lm in self.lm.items()}

    # ------------------------------------------------------------------ warm start
    def warm_start(self, ctl: Controller) -> dict[str, float]:
        """Behaviour cloning of the teacher's legal moves (teaches the action format only); then
        every learner's version-0 snapshot, the first frozen opponent."""
        cfg, ws = self.cfg, self.cfg.warm_start
        metrics: dict[str, float] = {}
        sft = SFTConfig(steps=max(1, ws.steps), lr=ws.lr, warmup_steps=0,
                        batch_size=ws.games_per_step)
        for pid in self.learners if ws.steps else []:
            teacher = Teacher(self.lm[pid], scripted_factory(ws.teacher)(seed=cfg.seed + 1))
            runner = EpisodeRunner({"teacher": teacher},
                                   cfg.runner.model_copy(update={"seed": cfg.seed + 2}))
            metrics = objectives.sft(ctl, pid, lambda i: training_trajectories(runner.run(
                self._teacher_games(i)).trajectories), sft, ws.steps, self.progress,
                f"warm start {pid}")
        self.memory.forget_after(-1)  # a fresh start: what an earlier start wrote in Redis,
        self.tournament.store.truncate_after(-1)  # and its matches (not this run's results)
        versions = ctl.versions()
        for pid in self.learners:
            ctl.snapshot(pid, 0)
        self.tournament.on_step(0, {pid: versions[pid] for pid in self.learners})
        return metrics | refresh_best_responses(self.cfg, self.baselines, self.lm, 0)

    def _teacher_games(self, i: int) -> list[EpisodeSpec]:
        """Warm-start step ``i``'s games of the teacher against itself, in every env."""
        n, seed = self.cfg.warm_start.games_per_step, self.cfg.seed
        return [EpisodeSpec(e.id, ("teacher",) * len(self.seats[e.id]),
                            seed=seed * 1_000_003 + i * n + j, env_kwargs=dict(e.kwargs))
                for e in self.cfg.envs for j in range(n)]

    # ------------------------------------------------------------------ one step
    def next_episodes(self, step: int) -> list[EpisodeSpec]:
        self.matches = self.tournament.next_matches(self.cfg.train.games_per_step)
        self.memory.begin_step(step)
        return [EpisodeSpec(m.env, m.keys, seed=match_seed(self.cfg.seed, m.match_id),
                            env_kwargs=self.env_kwargs[m.env], episode_id=m.match_id)
                for m in self.matches]

    def players(self, specs: list[EpisodeSpec]) -> dict[str, Any]:
        needed = {key for spec in specs for key in spec.players}
        return {key: self._player(key) for key in needed}

    def _player(self, key: str) -> Any:
        if key in self.lm:
            return self.lm[key]
        if key in self.baselines:
            return self.baselines[key]
        if key not in self.frozen:
            self.frozen[key] = LMPolicy(self.ctl.handle(key), self.templates, trainable=False)
        return self.frozen[key]

    def on_episode_end(self) -> Any:
        return self.memory.on_episode_end if self.memory.policies else None

    def record(self, played: RunResult, step: int) -> dict[str, float]:
        self.tournament.record([to_result(m, r) for m, r in zip(self.matches, played.episodes)],
                               step)
        return {**played.metrics, "match/games": float(self.tournament.games)}

    def training_data(self, played: RunResult, step: int) -> dict[str, Any]:
        return {pid: [t for t in played.trajectories if t.policy_id == pid]
                for pid in self.learners}

    def after_step(self, ctl: Controller, step: int) -> dict[str, float]:
        """Snapshots the scheduler asks for; dropped ones are freed; exploiters reset."""
        versions = ctl.versions()
        for ev in self.tournament.on_step(step, {pid: versions[pid] for pid in self.learners}):
            player = ev.player
            ctl.snapshot(player.policy_id, player.version)
            if ev.reset:  # before the drops: the @0 snapshot may leave the pool (max_pool)
                log.info("league: %s resets to its initial weights", player.policy_id)
                ctl.reset_to(player.policy_id, f"{player.policy_id}@0")
            for old in ev.dropped:
                self.frozen.pop(old.key, None)
                ctl.drop_snapshot(old.key)
        if self.progress and step % max(1, self.eval_every) == 0:
            log.info("%s", self.tournament.progress_line())
        return refresh_best_responses(self.cfg, self.baselines, self.lm, step)

    def done(self) -> bool:
        return self.tournament.done

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, ctl: Controller) -> dict[str, float]:
        """Each learner vs each eval opponent that may sit opposite it (not rated, no training
        data, no memory writes): the games are spread evenly over the seats the learner may take
        (its roles) whose other seats the opponent may all take; the opponent fills every other
        seat. An opponent that can never sit opposite the learner is skipped.

        Metrics: ``eval/win_rate_vs_<opp>``, ``eval/draw_rate_vs_<opp>`` and
        ``eval/loss_rate_vs_<opp>`` (averaged over seats; each also per seat,
        ``eval/win_rate_seat<i>_vs_<opp>``), ``eval/return_vs_<opp>`` (the learner's mean return:
        the deal value in Bargain-v0), ``eval/invalid_rate_vs_<opp>`` (invalid moves per move);
        for preference learners also ``eval/pref_accuracy``, ``eval/pref_margin`` and
        ``eval/pref_likelihood_accuracy`` on held-out outcome pairs (:meth:`heldout_pairs`).
        """
        out: dict[str, float] = {}
        for pid in self.learners:
            lm = self.lm[pid]
            sampling = greedy(lm.engine.cfg.rollout.sampling) if self.cfg.eval.greedy else None
            player = LMPolicy(lm.engine, self.templates, trainable=False, sampling=sampling,
                              memory=lm.memory)
            for opp in self.cfg.eval.opponents:
                out |= self._eval_pair(pid, player, opp)
            if self.cfg.eval.exploitability == "auto":  # exact, at the sampling temperature
                out |= {f"{k}@{pid}": v for k, v in exploit_metrics(self.cfg.envs, lm).items()}
                meta = getattr(self.tournament.scheduler, "meta_strategy", None)  # PSRO-like
                weights = meta(pid) if meta is not None else {}
                out |= {f"{k}@{pid}": v for k, v in mixture_metrics(
                    self.cfg.envs, {k: self._player(k) for k in weights}, weights).items()}
            exploiter = self.cfg.eval.exploiter
            if exploiter is not None and (ctl.step % exploiter.every == 0
                                          or ctl.step >= self.cfg.train.steps):
                out |= {f"{k}@{pid}": v for k, v in self._exploit(ctl, pid).items()}
            if self.policy_cfgs[pid].algorithm.is_preference:
                out |= self._pref_eval(ctl, pid)
        if len(self.learners) == 1:
            out = {k.replace(f"@{self.learners[0]}", ""): v for k, v in out.items()}
        return out

    def _exploit(self, ctl: Controller, pid: str) -> dict[str, float]:
        """``eval.exploiter``: a fresh exploiter trained against ``pid``'s current weights
        (exported to ``exploiters/step_N/<pid>/target``), in its own run folder beside."""
        opts = self.cfg.eval.exploiter
        folder = ctl.run_dir.path / "exploiters" / f"step_{ctl.step}" / pid
        target = ctl.save_pretrained(pid, folder / "target")
        return train_exploiter(self.cfg, pid, target, folder / "run", opts.steps,
                               opts.games_per_step, opts.games, run=run_fresh)

    def eval_seats(self, pid: str, opp: str, env: str) -> list[int]:
        """Seats of ``env`` where ``pid`` may play with ``opp`` in every other seat."""
        agents = self.seats[env]

        def may(key: str, agent: str) -> bool:
            return self.roles[key] is None or agent in self.roles[key]

        return [i for i, a in enumerate(agents) if may(pid, a)
                and all(may(opp, b) for b in agents if b != a)]

    def _eval_games(self, pid: str, player: Any, opp: str, seed: int) -> RunResult:
        """``eval.games`` games of ``player`` (as ``pid``) vs ``opp`` per env, spread over
        :meth:`eval_seats`; env seeds from ``seed``, the same at every evaluation."""
        specs = []
        for env in self.cfg.envs:
            mine = self.eval_seats(pid, opp, env.id)
            per_seat = self.cfg.eval.games // max(1, len(mine))
            for k, seat in enumerate(mine):
                for i in range(per_seat):
                    players = tuple(pid if s == seat else opp
                                    for s in range(len(self.seats[env.id])))
                    specs.append(EpisodeSpec(env.id, players,
                                             seed=seed * (k * per_seat + i + 1) + 7,
                                             env_kwargs=dict(env.kwargs)))
        if not specs:
            return RunResult([], [], {})
        runner_cfg = self.cfg.runner.model_copy(update={"random_seats": False, "seed": 12345})
        opponent = (self.baselines[opp] if opp in self.baselines else  # or a frozen policy
                    LMPolicy(self.ctl.handle(opp), self.templates, trainable=False))
        return EpisodeRunner({pid: player, opp: opponent}, runner_cfg,
                             env_pool=self.ctl.env_pool).run(specs)

    def _eval_pair(self, pid: str, player: LMPolicy, opp: str) -> dict[str, float]:
        records = self._eval_games(pid, player, opp, seed=10_000_019).episodes
        if not records:
            return {}
        seats = max(len(a) for a in self.seats.values())
        counts = [dict.fromkeys(_OUTCOMES, 0) for _ in range(seats)]  # per seat: win/draw/loss
        invalid = moves = returns = 0.0
        for rec in records:
            agent = next(a for a, p in rec.seats.items() if p == pid)
            seat = list(rec.seats).index(agent)
            result = rec.results[agent]
            counts[seat]["win" if result in ("win", "solved") else
                         "draw" if result == "draw" else "loss"] += 1
            invalid += rec.invalid[agent]
            returns += rec.returns[agent]
            n = len(rec.seats)
            moves += max(1, (rec.num_actions + (n - 1 - seat)) // n)
        suffix = f"_vs_{opp}@{pid}"
        rates = {s: {k: v / sum(c.values()) for k, v in c.items()}
                 for s, c in enumerate(counts) if sum(c.values())}
        out = {f"eval/return{suffix}": returns / len(records),
               f"eval/invalid_rate{suffix}": invalid / max(1.0, moves)}
        for k in _OUTCOMES:  # seat-averaged, then per seat
            out[f"eval/{k}_rate{suffix}"] = sum(r[k] for r in rates.values()) / len(rates)
            out |= {f"eval/{k}_rate_seat{s}{suffix}": r[k] for s, r in rates.items()}
        return out

    def heldout_pairs(self, pid: str) -> list[PreferenceExample]:
        """Outcome pairs (:func:`~agentrt.controller.objectives.outcome_pairs`) of ``eval.games`` games per
        eval opponent, sampled at the policy's temperature, never trained on."""
        lm = self.lm[pid]
        sampler = LMPolicy(lm.engine, self.templates, trainable=True, memory=lm.memory)
        trajs = [t for opp in self.cfg.eval.opponents
                 for t in self._eval_games(pid, sampler, opp, seed=20_000_003).trajectories]
        return outcome_pairs(trajs, pid)

    def _pref_eval(self, ctl: Controller, pid: str) -> dict[str, float]:
        """Held-out preference accuracy and margin of a preference learner. The pairs are built
        at its first evaluation (step 0: the policy is its reference, so accuracy 0.5) and kept
        (checkpointed), so every evaluation scores the same pairs."""
        pool = ctl.pool_of(pid)
        if pid not in self.heldout:
            self.heldout[pid] = pool.fill_reference(self.heldout_pairs(pid), adapter=pid)
        if not self.heldout[pid]:
            return {}
        metrics = pool.preference_eval(self.heldout[pid], adapter=pid)
        return {f"{k}@{pid}": v for k, v in metrics.items()} | {
            f"eval/pref_pairs@{pid}": float(len(self.heldout[pid]))}

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Plain data and tensors only (checkpoints load with ``weights_only=True``)."""
        return {"baselines": {k: scripted_state(b) for k, b in self.baselines.items()},
                "tournament": self.tournament.state_dict(), "memory": self.memory.state_dict(),
                "heldout": {k: [asdict(ex) for ex in v] for k, v in self.heldout.items()}}

    def stored_rows(self, step: int) -> dict[str, int]:
        return {MatchStore.FILENAME: MatchStore.count_through(self.ctl.run_dir.path, step)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tournament.load_state_dict(state["tournament"])
        self.memory.load_state_dict(state.get("memory", {}))
        self.memory.forget_after(self.tournament.step)  # Redis: the steps about to be replayed
        for key, saved in state["baselines"].items():
            load_scripted_state(self.baselines[key], saved)
        self.heldout = {k: [PreferenceExample(**ex) for ex in v]
                        for k, v in state.get("heldout", {}).items()}

    def finish(self, ctl: Controller) -> None:
        """Final leaderboard and win/draw/loss table on the terminal, the HTML report (and
        its seat_results.json), the final models."""
        results = [r for r, _ in self.tournament.store.results()]
        board = build_leaderboard(results)
        self.leaderboard_text = format_leaderboard(board)
        self.seat_text = format_seat_table(seat_table(self.tournament.store.seat_outcomes(),
                                                      [r.key for r in board]))
        self.report_path = self.tournament.write_report()
        if ctl.step == self.steps:
            for pid in self.learners:
                ctl.save_pretrained(pid, ctl.run_dir.path / "final_models" / pid)


def run_fresh(cfg: TournamentRunConfig) -> dict[str, float]:
    """A league run of ``cfg`` from scratch (an exploiter's: its folder is started over)."""
    return LeagueTrainer(cfg, start="new").run()


class LeagueTrainer(Run):
    """``agentrt tournament run`` from Python: :class:`~agentrt.controller.launch.Run` over a
    :class:`LeagueWorkload` (``start``: as :class:`~agentrt.controller.launch.Run`'s)."""

    def __init__(self, cfg: TournamentRunConfig, start: str = "auto") -> None:
        super().__init__(cfg, LeagueWorkload, start)
