"""``agentrt decompose run``: the decomposer's scheduler on the controller loop.

Each step draws ``tasks_per_step`` training tasks and plays ``group_size`` chains of each
(``Decompose-v0`` through the episode runner: the chains of a step run at once, the requests of
all chains waiting on one policy go to it in one batched generate). The router binds every
subtask attempt to a specialist when it first acts, and learns from the step's outcomes.

Credit at two levels: a specialist's trajectory (one per attempt) earns its subtask verifier's
reward plus ``chain.outcome_share`` of the task outcome, with a baseline per (subtask type,
policy); the LM planner's trajectory earns the task outcome, with a baseline per task over its
``group_size`` chains. Each policy then trains through its objective like any other workload.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections import Counter, defaultdict
from typing import Any, Callable

from agentrt.decomposer.config import DecomposeConfig
from agentrt.decomposer.env import PLANNER, ChainEnv, family_splits
from agentrt.decomposer.router import Router
from agentrt.decomposer.sdk import WHOLE
from agentrt.envs.tasks import Example
from agentrt.policies.base import as_policy
from agentrt.policies.chat import policy_chat
from agentrt.policies.lm import LMPolicy, PromptTemplate

from agentrt.controller.episodes import EPISODES
from agentrt.controller.launch import Run
from agentrt.controller.loop import Controller, greedy
from agentrt.controller.run_dir import count_jsonl, truncate_jsonl
from agentrt.controller.workload import Workload
from agentrt.core.errors import ConfigError
from agentrt.core.registry import import_callable
from agentrt.runner.core import ROUTED, EpisodeRunner, EpisodeSpec, RunnerConfig, RunResult
from agentrt.runner.record import EpisodeRecord
from agentrt.workloads.prompts.data.sources import PromptSampler
from agentrt.workloads.prompts.data.sources import chat_prompt
from agentrt.workloads.prompts.workload import sft_warm_start

log = logging.getLogger(__name__)

# Every observation is the whole state of its step: bos + observation, as SFT rows see it.
CHAIN_TEMPLATE = PromptTemplate(first="{observation}", history=False)
ENV = "Decompose-v0"


class DecomposeWorkload(Workload):
    """Chains of a task family for a planner and its specialists (see the module docstring)."""

    label = "decompose"
    outputs = ("chains.jsonl", "eval_chains.jsonl", "report.html", "final",
               f"{EPISODES}*")  # + RunDir.outputs
    live = ("train.tasks_per_step", "train.group_size")  # + each policy's, the shared fields
    refused = {"inject": "a decompose run draws the tasks of its family; it has no prompts to "
               "inject",
               "feedback": "a chain's rewards are its subtask verifiers' and its task outcome, "
               "known when it ends; there is no late reward to give"}

    def __init__(self, cfg: DecomposeConfig) -> None:
        super().__init__(cfg)
        f = cfg.family
        self.family, self.train_tasks, self.eval_tasks = family_splits(
            f.name, json.dumps(f.options, sort_keys=True), f.train_size, f.eval_size, f.seed)
        self.planner = cfg.planner.policy if cfg.planner.kind == "lm" else None
        probe = ChainEnv(**self.env_kwargs("train"))
        self.seats = len(probe.possible_agents)
        self.runner = RunnerConfig(concurrency=self.episodes_per_step(cfg),
                                   random_seats=False, invalid_penalty=0.0,
                                   max_turns=self.seats + 1, seed=cfg.seed,
                                   policy_errors="record")
        self.tasks = PromptSampler(list(range(len(self.train_tasks))), cfg.seed)
        self.tools = {t.id: as_policy(import_callable(t.fn, f"tools.{t.id}")) for t in cfg.tools}
        self.router = Router(cfg.router, cfg.specialists(),
                             {k: t.skills for k, t in self.family.types.items()}, seed=cfg.seed,
                             memory_path=None)
        self.last_step = 0  # the step whose chains were recorded last

    def env_kwargs(self, split: str) -> dict[str, Any]:
        c, f, p = self.cfg.chain, self.cfg.family, self.cfg.planner
        return {"family": f.name, "options": dict(f.options), "split": split,
                "train_size": f.train_size, "eval_size": f.eval_size, "seed": f.seed,
                "planner": p.kind, "max_subtasks": p.max_subtasks, "token_budget": p.token_budget,
                "on_failure": c.on_failure, "repairs": c.repairs,
                "outcome_share": c.outcome_share}

    # ------------------------------------------------------------------ set-up
    def start(self, ctl: Controller) -> None:
        self.run_dir = ctl.run_dir
        self.chains_path = ctl.run_dir.path / "chains.jsonl"
        self.make_players(ctl)

    def make_players(self, ctl: Controller) -> None:
        sampling = {p.id: p.rollout.sampling for p in self.cfg.policies}
        handles = {p.id: ctl.handle(p.id) for p in self.cfg.policies}
        self.chain_players: dict[str, Any] = {pid: LMPolicy(h, CHAIN_TEMPLATE)
                                              for pid, h in handles.items()} | self.tools
        self.eval_policies: dict[str, Any] = {
            pid: LMPolicy(h, CHAIN_TEMPLATE, trainable=False,
                          sampling=greedy(sampling[pid]) if self.cfg.eval.greedy else None)
            for pid, h in handles.items()} | self.tools

    def episodes_per_step(self, cfg: DecomposeConfig) -> int:
        return cfg.train.tasks_per_step * cfg.train.group_size

    def warm_start(self, ctl: Controller) -> dict[str, float]:
        """SFT of every trainable LM policy on reference rows of the training tasks it would
        do: the planner on rule plans, a specialist on its subtask types' reference outputs."""
        self.truncate_records(-1)  # records of a start killed before its first checkpoint
        s = self.cfg.sft
        metrics: dict[str, float] = {}
        steps = {p.id: s.steps if p.sft_steps is None else p.sft_steps for p in self.cfg.policies}
        cfgs = {p.id: p for p in self.cfg.policies}
        for pid, examples in self.demonstration_rows().items():
            if steps[pid]:
                chat = policy_chat(cfgs[pid], ctl.tokenizer(pid))  # as the chain prompts are
                if chat is not None:
                    examples = [Example(chat_prompt(chat, ex.prompt), ex.answer, ex.info)
                                for ex in examples]
                m = sft_warm_start(ctl, pid, examples, s, steps[pid], self.cfg.seed,
                                   self.progress, label=f"sft {pid}", bos=chat is None)
                metrics[f"sft/loss@{pid}"] = m["sft/loss"]
        return metrics

    def demonstration_rows(self) -> dict[str, list[Example]]:
        """SFT rows per trainable LM policy (see :meth:`warm_start`)."""
        skills = self.cfg.specialists()
        types = self.family.types
        out: dict[str, list[Example]] = {}
        rows_of_tasks = [row for task in self.train_tasks
                         for row in self.family.demonstrations(task)]  # once for all policies
        for i, p in enumerate(self.cfg.policies):
            if not p.trainable:
                continue
            mine = {k for k, t in types.items() if set(t.skills) & set(skills.get(p.id, ()))}
            if self.cfg.planner.kind == "single":
                mine &= {WHOLE}
            else:
                mine -= {WHOLE}
            rows = [Example(obs, target) for who, obs, target in rows_of_tasks
                    if who in mine or (who == PLANNER and p.id == self.planner)]
            if p.sft_match is not None:
                pattern = re.compile(p.sft_match)
                rows = [ex for ex in rows if pattern.search(ex.prompt)]
                if not rows and (self.cfg.sft.steps if p.sft_steps is None else p.sft_steps):
                    raise ConfigError(f"policies.{i}.sft_match: {p.sft_match!r} matches no warm-"
                                      f"start row of {p.id}'s subtask types "
                                      f"({', '.join(sorted(mine)) or 'none'})")
            if rows:
                out[p.id] = rows
        return out

    # ------------------------------------------------------------------ one step
    def specs(self, split: str, indices: list[int], group_size: int) -> list[EpisodeSpec]:
        players = (self.planner or ROUTED,) + (ROUTED,) * (self.seats - 1)
        kwargs = self.env_kwargs(split)
        return [EpisodeSpec(ENV, players, seed=i * 1000 + g, env_kwargs=kwargs,
                            options={"index": i}, group=f"task{i}")
                for i in indices for g in range(group_size)]

    def next_episodes(self, step: int) -> list[EpisodeSpec]:
        return self.specs("train", self.tasks.next(self.cfg.train.tasks_per_step),
                          self.cfg.train.group_size)

    def players(self, specs: list[EpisodeSpec]) -> dict[str, Any]:
        return self.chain_players

    def seat_router(self, explore: bool = True) -> Callable[[Any, str], str]:
        """Binds an attempt agent to a specialist when it first acts."""
        other = self.cfg.chain.retry_with == "other"

        def route(env: Any, agent: str) -> str:
            pid = self.router.route(env.subtask(agent), env.observe(agent),
                                    exclude=env.failed_by() if other else frozenset(),
                                    explore=explore)
            env.bind(agent, pid)
            return pid

        return route

    def record(self, played: RunResult, step: int) -> dict[str, float]:
        """Router updates from the step's subtask outcomes, chain records, chain metrics."""
        chains = [chain_of(r) for r in played.episodes]
        for i, (record, chain) in enumerate(zip(played.episodes, chains)):
            for s in chain["steps"]:
                self.router.record(s["type"], s["observation"], s["policy"], s["ok"], step)
            chain["chain_id"] = f"{step}:{i}"
            chain["step"] = step
        self.router.clear_pending()  # every chain of the step is over (some cut short)
        with open(self.chains_path, "a") as f:
            f.writelines(json.dumps(c) + "\n" for c in chains)
        self.last_step = step
        return (chain_metrics(chains, "decompose") | self.router.metrics()
                | {k: v for k, v in played.metrics.items()
                   if k.startswith(("rollout/", "perf/", "timing_s/"))})

    def training_data(self, played: RunResult, step: int) -> dict[str, Any]:
        """Each trainable LM policy's trajectories, grouped for baselines: a specialist's per
        (subtask type, policy) (the type as its group's role, whatever the task or attempt
        seat), the planner's per task."""
        data: dict[str, list[Any]] = defaultdict(list)
        trainable = {p.id for p in self.cfg.policies if p.trainable}
        for traj in played.trajectories:
            if traj.policy_id not in trainable:
                continue
            if traj.role != PLANNER:
                kind = traj.info["final_info"].get("subtask", "?")
                group = dataclasses.replace(traj.group_id, role=kind, task=None)
                traj = dataclasses.replace(traj, group_id=group)
            data[traj.policy_id].append(traj)
        return dict(data)

    def evaluate(self, ctl: Controller) -> dict[str, float]:
        """Held-out tasks, greedy decoding and greedy routing (``eval.greedy``); the router
        does not learn from them."""
        n = self.cfg.eval.size or len(self.eval_tasks)
        specs = self.specs("eval", list(range(min(n, len(self.eval_tasks)))), 1)
        route = self.seat_router(explore=False)  # the router's best pick; it learns nothing
        played = EpisodeRunner(self.eval_policies, self.runner, route=route).run(specs)
        chains = [chain_of(r) for r in played.episodes]
        with open(self.run_dir.path / "eval_chains.jsonl", "a") as f:
            f.write(json.dumps({"step": ctl.step, "chains": chains[:self.cfg.eval.examples]})
                    + "\n")
        return chain_metrics(chains, "eval")

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"tasks": self.tasks.state_dict(), "router": self.router.state_dict(),
                "last_step": self.last_step}

    def stored_rows(self, step: int) -> dict[str, int]:
        return {path.name: count_jsonl(path, step)
                for path in (self.chains_path, self.run_dir.path / "eval_chains.jsonl")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tasks.load_state_dict(state["tasks"])
        self.router.load_state_dict(state["router"])
        self.last_step = int(state["last_step"])
        self.truncate_records(self.last_step)

    def truncate_records(self, after_step: int) -> None:
        """Drops chain records of steps a resume will redo (so no chain is counted twice)."""
        for path in (self.chains_path, self.run_dir.path / "eval_chains.jsonl"):
            truncate_jsonl(path, after_step)

    def finish(self, ctl: Controller) -> None:
        from agentrt.decomposer.report import write_report

        path = write_report(ctl.run_dir.path)
        log.warning("decomposer report: %s", path)
        if ctl.step == self.steps:
            for p in self.cfg.policies:
                if p.trainable:
                    ctl.save_pretrained(p.id, ctl.run_dir.path / "final" / p.id)


def chain_of(record: EpisodeRecord) -> dict[str, Any]:
    """The chain summary of a finished episode, each step with the policy that did it."""
    chain = next((info["chain"] for info in record.final_infos.values() if "chain" in info),
                 None)
    if chain is None:  # ended before the env could record it (e.g. a context limit)
        chain = {"outcome": "error", "reason": f"episode ended by {record.ended_by}",
                 "success": False, "plan_valid": False, "plan": "", "steps": []}
    chain = dict(chain)
    chain["steps"] = [dict(s, policy=record.seats.get(s["agent"], "?")) for s in chain["steps"]]
    chain["planner"] = record.seats.get(PLANNER, "rule")
    return chain


def chain_metrics(chains: list[dict[str, Any]], prefix: str) -> dict[str, float]:
    """``<prefix>/success``, ``/plan_valid``, ``/outcome/<kind>``, ``/subtask_success/<type>``,
    ``/chain_length`` of a set of chains."""
    n = max(1, len(chains))
    out = {f"{prefix}/success": sum(c["success"] for c in chains) / n,
           f"{prefix}/plan_valid": sum(bool(c["plan_valid"]) for c in chains) / n,
           f"{prefix}/chain_length": sum(len(c["steps"]) for c in chains) / n}
    for kind, k in Counter(c["outcome"] for c in chains).items():
        out[f"{prefix}/outcome/{kind}"] = k / n
    tried: dict[str, list[bool]] = defaultdict(list)
    for c in chains:
        for s in c["steps"]:
            tried[s["type"]].append(bool(s["ok"]))
    for kind, oks in sorted(tried.items()):
        out[f"{prefix}/subtask_success/{kind}"] = sum(oks) / len(oks)
    return out


class Decomposer(Run):
    """``agentrt decompose run`` from Python: :class:`~agentrt.controller.launch.Run` over a
    :class:`DecomposeWorkload` (``start``: as :class:`~agentrt.controller.launch.Run`'s)."""

    def __init__(self, cfg: DecomposeConfig, start: str = "auto") -> None:
        super().__init__(cfg, DecomposeWorkload, start)
