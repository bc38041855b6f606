"""The decomposer's envs: ``Decompose-v0`` plays one task as a chain of routed subtasks, and
``WordChain-v0`` / ``EventPlan-v0`` are a family's whole tasks for one agent (Gymnasium).

``Decompose-v0`` is a turn-based multi-agent env (:class:`~agentrt.envs.core.MultiAgentEnv`):

1. ``planner`` writes a plan (``planner="lm"``), or the family's rule planner makes it
   (``"rule"``), or the whole task is one step (``"single"``: a generalist);
2. each step, in the plan's order, is one *attempt* agent ``a0``, ``a1``, ... whose observation
   the subtask type builds from the task and the outputs of the steps it reads; the episode
   runner binds each attempt to a policy when it first acts (the router of
   :mod:`agentrt.decomposer.router` picks it);
3. the subtask's verifier scores the output (that is the attempt's reward at once); a failure ends
   the chain, retries the step (``on_failure="repair"``, up to ``repairs`` times, the observation
   saying why the last try failed) or goes on (``"continue"``);
4. the family assembles and verifies the answer: every attempt gets ``outcome_share`` of the
   task outcome on top of its subtask reward, the planner the outcome itself.

A bad plan (unparseable, unknown subtask, cycle, over budget), a verifier that raises and a policy
that raises (:meth:`ChainEnv.on_policy_error`) are outcomes with reasons, never exceptions.
The chain's record is in every agent's final ``infos[agent]["chain"]``.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Literal

from agentrt.decomposer.plan import Plan, PlanError, Step, parse_plan
from agentrt.decomposer.sdk import (WHOLE, StepContext, Task, TaskFamily, Verdict, as_verdict,
                                    visible)
from agentrt.decomposer.sdk import make_family
from agentrt.envs.core import MultiAgentEnv, TextEnv, action_text, clean_text

PLANNER = "planner"


@functools.lru_cache(maxsize=16)
def family_splits(family: str, options_json: str, train_size: int, eval_size: int, seed: int
                  ) -> tuple[TaskFamily, list[Task], list[Task]]:
    """The family and its (train, eval) tasks, cached per process."""
    fam = make_family(family, json.loads(options_json))
    return (fam, *fam.splits(train_size, eval_size, seed))


def _tasks(family: str, options: dict[str, Any] | None, split: str, train_size: int,
           eval_size: int, seed: int) -> tuple[TaskFamily, list[Task]]:
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    fam, train, evals = family_splits(family, json.dumps(options or {}, sort_keys=True),
                                      train_size, eval_size, seed)
    return fam, train if split == "train" else evals


class ChainEnv(MultiAgentEnv):
    """One task of a family as a chain of subtasks (see the module docstring).

    Args:
        family: Registered family name; ``options`` its options.
        split / train_size / eval_size / seed: Which tasks (disjoint train and eval splits).
        planner: "lm" (the planner agent writes the plan), "rule" or "single".
        max_subtasks: Steps a plan may have.
        token_budget: Token budget of all of a plan's steps together (None: no limit).
        on_failure: "end", "repair" or "continue" after a failed subtask.
        repairs: Retries of one step under "repair".
        outcome_share: Share of the task outcome each attempt gets on top of its own reward.
    """

    metadata = {"render_modes": ["ansi"], "name": "decompose"}
    max_action_chars = 512

    def __init__(self, family: str = "wordchain", options: dict[str, Any] | None = None,
                 split: str = "train", train_size: int = 1000, eval_size: int = 200,
                 seed: int = 1234, planner: Literal["lm", "rule", "single"] = "rule",
                 max_subtasks: int = 6, token_budget: int | None = None,
                 on_failure: Literal["end", "repair", "continue"] = "end", repairs: int = 1,
                 outcome_share: float = 0.5, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        if planner not in ("lm", "rule", "single"):
            raise ValueError(f"planner must be 'lm', 'rule' or 'single', got {planner!r}")
        if on_failure not in ("end", "repair", "continue"):
            raise ValueError(f"on_failure must be 'end', 'repair' or 'continue', got "
                             f"{on_failure!r}")
        self.family, self.tasks = _tasks(family, options, split, train_size, eval_size, seed)
        self.family_name, self.planner = family, planner
        self.max_subtasks, self.token_budget = max_subtasks, token_budget
        self.on_failure, self.repairs = on_failure, repairs if on_failure == "repair" else 0
        self.outcome_share = outcome_share
        self.attempt_agents = [f"a{i}" for i in range(max_subtasks * (1 + self.repairs))]
        self.possible_agents = [PLANNER, *self.attempt_agents]

    # ------------------------------------------------------------------ episode
    def _reset(self, options: dict[str, Any]) -> None:
        index = options.get("index")
        if index is None:
            index = int(self.np_random.integers(len(self.tasks)))
        self.task = self.tasks[int(index) % len(self.tasks)]
        self.plan: Plan | None = None
        self.outputs: dict[int, str] = {}
        self.history: list[dict[str, Any]] = []
        self.cursor = 0          # position in plan.steps
        self.tries = 0           # failed tries of the current step
        self.next_attempt = 0
        self.failure: str | None = None
        self.note = ""
        self.plan_text = ""
        self.bound: dict[str, str] = {}  # attempt agent -> the policy the router bound it to
        if self.planner == "lm":
            self.agent_selection = PLANNER
        else:
            plan = Plan((Step(0, WHOLE),), WHOLE) if self.planner == "single" else \
                self.family.rule_plan(visible(self.task))
            self._start(plan)

    def _start(self, plan: Plan) -> None:
        self.plan, self.plan_text = plan, plan.text
        self._next_attempt()

    def _next_attempt(self) -> None:
        if self.next_attempt >= len(self.attempt_agents):
            self._end("subtask_failed", "no attempts left")
            return
        self.agent_selection = self.attempt_agents[self.next_attempt]
        self.next_attempt += 1

    @property
    def step_now(self) -> Step:
        assert self.plan is not None
        return self.plan.steps[self.cursor]

    def context(self, seen: bool = False) -> StepContext:
        """The current step's context; ``seen``: with the task as observations read it (its
        data sealed), not as verifiers do."""
        assert self.plan is not None
        task = visible(self.task) if seen else self.task
        return StepContext(task, self.step_now, self.plan, dict(self.outputs))

    def subtask(self, agent: str | None = None) -> str | None:
        """The subtask type ``agent`` (default: the agent to move) works on (None: the planner or
        the episode is over). The router reads it to bind the agent to a policy."""
        agent = agent or self.agent_selection
        if self._done or agent == PLANNER or agent != self.agent_selection:
            return None
        return self.step_now.type

    def bind(self, agent: str, policy: str) -> None:
        """Notes the policy the router bound ``agent`` to (read by :meth:`failed_by`)."""
        self.bound[agent] = policy

    def failed_by(self) -> frozenset[str]:
        """The policies whose tries of the current step failed (a repair may route around
        them)."""
        if self.plan is None or self._done:
            return frozenset()
        step = self.step_now.id
        return frozenset(self.bound[h["agent"]] for h in self.history
                         if h["step"] == step and h["agent"] in self.bound)

    def max_new_tokens(self, agent: str) -> int | None:
        """The acting step's token budget (an LM policy generates at most this many tokens)."""
        kind = self.subtask(agent)
        return self.family.types[kind].max_tokens if kind else None

    # ------------------------------------------------------------------ MultiAgentEnv hooks
    def _legal(self, agent: str) -> list[str] | None:
        return None

    def _parse(self, agent: str, text: str) -> Any:
        return text  # any text is a move: a bad plan or a wrong answer is an outcome, not invalid

    def _observe(self, agent: str) -> str:
        if agent == PLANNER:
            return self.family.planner_prompt(visible(self.task))
        if self._done or agent != self.agent_selection or self.plan is None:
            return ""
        obs = self.family.types[self.step_now.type].observe(self.context(seen=True))
        return f"{self.note}\n{obs}" if self.note else obs

    def _apply(self, agent: str, move: Any) -> None:
        if agent == PLANNER:
            self._apply_plan(str(move))
        else:
            self._apply_output(agent, str(move), None)

    def on_policy_error(self, agent: str, message: str) -> None:
        """The policy of ``agent`` raised instead of acting: a failed try with that reason."""
        if self._done or agent != self.agent_selection:
            return
        for a in self.agents:
            self.rewards[a] = 0.0
        if agent == PLANNER:
            self._end("bad_plan", f"planner raised: {message}")
        else:
            self._apply_output(agent, "", f"specialist raised: {message}")
        self._refresh_infos()

    def _apply_plan(self, text: str) -> None:
        budgets = {k: t.max_tokens for k, t in self.family.types.items()}
        known = set(self.family.types) - {WHOLE}
        try:
            plan = parse_plan(text, known, self.max_subtasks, budgets, self.token_budget)
        except PlanError as e:
            self.plan_text = clean_text(text.strip(), 120)
            self._end("bad_plan", f"{e.kind}: {e.reason}", plan_error=e.kind)
            return
        self._start(plan)

    def _apply_output(self, agent: str, text: str, error: str | None) -> None:
        step = self.step_now
        observation = self.observe(agent)  # what the policy (and the router) saw
        if error is None:
            try:
                verdict = as_verdict(self.family.types[step.type].verify(self.context(), text))
            except Exception as e:  # user verifier code: recorded, never raised
                verdict = Verdict(False, f"verifier raised {type(e).__name__}: {e}")
        else:
            verdict = Verdict(False, error)
        self.rewards[agent] = verdict.reward
        self.infos[agent].update(subtask=step.type, subtask_ok=verdict.ok, step=step.id)
        self.history.append({"agent": agent, "step": step.id, "type": step.type,
                             "observation": observation[:1000], "output": text.strip()[:200],
                             "ok": verdict.ok,
                             "reason": verdict.reason if not verdict.ok else "",
                             "reward": verdict.reward})
        if verdict.ok or self.on_failure == "continue":
            self.outputs[step.id] = text
            self.cursor, self.tries, self.note = self.cursor + 1, 0, ""
            if self.cursor == len(self.plan.steps):  # type: ignore[union-attr]
                self._verify_task()
            else:
                self._next_attempt()
        elif self.on_failure == "repair" and self.tries < self.repairs:
            self.tries += 1
            self.note = f"previous try failed: {verdict.reason}"[:160]
            self._next_attempt()
        else:
            self._end("subtask_failed", f"{step.type} (step {step.id}): {verdict.reason}")

    def _verify_task(self) -> None:
        assert self.plan is not None
        try:
            answer = self.family.answer(self.task, self.plan, self.outputs)
            verdict = as_verdict(self.family.verify(self.task, answer))
        except Exception as e:
            answer, verdict = "", Verdict(False, f"task verifier raised {type(e).__name__}: {e}")
        self._end("solved" if verdict.ok else "failed", verdict.reason, answer=answer,
                  success=verdict.ok)

    def _end(self, outcome: str, reason: str, answer: str = "", success: bool = False,
             plan_error: str | None = None) -> None:
        value = 1.0 if success else 0.0
        acted = {h["agent"] for h in self.history}
        for a in acted:
            self.rewards[a] = self.rewards.get(a, 0.0) + self.outcome_share * value
        if self.planner == "lm":
            self.rewards[PLANNER] = self.rewards.get(PLANNER, 0.0) + value
        chain = {"task_id": self.task.id, "task": self.task.text, "plan": self.plan_text,
                 "plan_valid": self.plan is not None, "plan_error": plan_error,
                 "outcome": outcome, "reason": "" if success else reason, "success": success, "answer": answer,
                 "steps": list(self.history)}
        for a in self.agents:
            self.infos[a]["chain"] = chain
        self.failure = None if success else reason
        self._finish()

    def _render(self) -> str:
        lines = [f"task: {self.task.text}", f"plan: {self.plan_text or '-'}"]
        lines += [f"  {h['agent']} {h['type']}: {h['output']!r} "
                  f"{'ok' if h['ok'] else 'FAIL ' + h['reason']}" for h in self.history]
        return "\n".join(lines)


class WholeTaskEnv(TextEnv):
    """A family's whole tasks for one agent, in Gymnasium's shapes: the observation is the task,
    one answer, reward 1 when the family's verifier accepts it (``info["reason"]`` when not).

    Args:
        family / options / split / train_size / eval_size / seed: As for :class:`ChainEnv`.
    """

    def __init__(self, family: str = "wordchain", options: dict[str, Any] | None = None,
                 split: str = "train", train_size: int = 1000, eval_size: int = 200,
                 seed: int = 1234, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode, max_obs_chars=2048, max_action_chars=512)
        self.family, self.tasks = _tasks(family, options, split, train_size, eval_size, seed)
        self.task: Task | None = None
        self._over = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        index = (options or {}).get("index")
        if index is None:
            index = int(self.np_random.integers(len(self.tasks)))
        self.task = self.tasks[int(index) % len(self.tasks)]
        self._over = False
        return self._obs(self.family.whole_prompt(visible(self.task))), {"task_id": self.task.id}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._over or self.task is None:
            return "", 0.0, True, False, {"invalid_action": True}
        self._over = True
        text = action_text(action) or ""
        try:
            verdict = as_verdict(self.family.verify(self.task, text))
        except Exception as e:
            verdict = Verdict(False, f"verifier raised {type(e).__name__}: {e}")
        return "", verdict.reward, True, False, {"reason": "" if verdict.ok else verdict.reason,
                                                 "invalid_action": False,
                                                 "answer": self.family.answer_of(self.task)}

    def _render(self) -> str:
        return self.task.text if self.task else ""
