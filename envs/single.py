"""Single-agent text envs: verifiable tasks, a calculator tool-use loop, and a recall task.

- ``Task-v0``: one prompt, one answer, reward from ``agentrt.rewards``: the example given to
  ``reset(options={"example": {prompt, answer, info}})`` (what ``agentrt train`` does, whatever
  its prompt source), or one of a built-in task (``agentrt.envs.tasks``).
- ``ToolUse-v0``: an arithmetic question too long for mental math; the agent may call a calculator
  ("calc: 347*29") and gets "calc result: 10063" as its next observation, then answers
  ("answer: 10063").
- ``Recall-v0``: a fixed hidden world (from ``world_seed``) of key -> 4-digit code facts; each
  episode asks one key. The answer cannot be inferred, but the final step reveals it in
  ``info["revealed"] = {"key": ..., "value": ...}`` (and the terminal observation), so only a
  policy that remembers earlier episodes can succeed.
"""

from __future__ import annotations

import ast
import functools
import json
import operator
import re
from typing import Any

import numpy as np

from agentrt.envs.core import TextEnv, action_text
from agentrt.rewards import resolve_reward, score
from agentrt.rewards.deferred import deferred_info
from agentrt.envs.tasks import Example, make_splits


@functools.lru_cache(maxsize=16)
def _splits(task: str, options_json: str, train_size: int, eval_size: int, seed: int
            ) -> tuple[list[Example], list[Example]]:
    return make_splits(task, json.loads(options_json), train_size, eval_size, seed)


class _OneShot(TextEnv):
    """Shared step-after-end behaviour: a harmless terminal tuple, never an exception."""

    _over = True

    def _after_end(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return "", 0.0, True, False, {"invalid_action": True}


class TaskEnv(_OneShot):
    """One example of a verifiable task per episode.

    Args:
        task: Name in ``agentrt.envs.tasks.TASKS`` ("arithmetic", "sort").
        split: "train" or "eval" (disjoint prompts).
        options: Task options (e.g. ``{"digits": 3}``).
        train_size / eval_size / seed: Passed to ``agentrt.envs.tasks.make_splits``.
        reward: Reward name or "module:function" (see ``agentrt.rewards``); None leaves the
            reward to a batch scored after the episode (``agentrt.rewards.deferred``): the
            episode ends with reward 0 and what the reward needs in its final info.

    ``reset(options={"example": {"prompt": p, "answer": a, "info": {...}}})`` plays that
    example (no task is generated); otherwise ``reset(seed=s)`` draws one of the task's split
    from the seed and ``reset(options={"index": i})`` picks one.
    """

    def __init__(self, task: str = "arithmetic", split: str = "train",
                 options: dict[str, Any] | None = None, train_size: int = 2000,
                 eval_size: int = 256, seed: int = 1234, reward: str | None = "exact_match",
                 render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode, max_obs_chars=1024, max_action_chars=32)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        self._split = (task, json.dumps(options or {}, sort_keys=True), train_size, eval_size,
                       seed, split)
        self.task = task
        self.reward_fn = resolve_reward(reward) if reward is not None else None
        self.example: Example | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        given = (options or {}).get("example")
        if given is not None:
            self.index, self.example, self._over = -1, Example(**given), False
            return self._obs(self.example.prompt), {"index": -1, "task": self.task}
        index = (options or {}).get("index")
        if index is None:
            index = int(self.np_random.integers(len(self.examples)))
        self.index = int(index) % len(self.examples)
        self.example = self.examples[self.index]
        self._over = False
        return self._obs(self.example.prompt), {"index": self.index, "task": self.task}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._over or self.example is None:
            return self._after_end()
        text = action_text(action) or ""
        ex = self.example
        self._over = True
        if self.reward_fn is None:
            return "", 0.0, True, False, {"answer": ex.answer, "invalid_action": False,
                                          **deferred_info(ex.prompt, text, ex.info)}
        (reward,), errors = score(self.reward_fn, [(ex.prompt, text, dict(ex.info))])
        return "", float(reward), True, False, {"answer": ex.answer, "reward_errors": errors,
                                                "invalid_action": False}

    @functools.cached_property
    def examples(self) -> list[Example]:
        """The task's examples of this split (generated on first use)."""
        *args, split = self._split
        train, evals = _splits(*args)
        return train if split == "train" else evals

    def _render(self) -> str:
        return self.example.prompt if self.example else ""


# ----------------------------------------------------------------------------- calculator
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Div: operator.truediv,
        ast.Pow: operator.pow}
_LIMIT = 10**30


def calculate(expression: str) -> int | float:
    """Evaluates + - * / // % ** on numbers, safely (no names, calls or huge powers).

    Raises:
        ValueError: anything that is not such an expression, or a result beyond 1e30.
    """
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):
        raise ValueError("not an arithmetic expression") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = node.value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = -_eval(node.operand) if isinstance(node.op, ast.USub) else _eval(node.operand)
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 10**6):
            raise ValueError("power too large")
        try:
            value = _OPS[type(node.op)](left, right)
        except (ZeroDivisionError, OverflowError):
            raise ValueError("division by zero or overflow") from None
        if isinstance(value, complex):
            raise ValueError("complex result")
    else:
        raise ValueError("only numbers and + - * / // % ** are allowed")
    if abs(value) > _LIMIT:
        raise ValueError("result too large")
    return value


class CalculatorEnv(_OneShot):
    """Multi-turn tool use: compute ``a*b+c*d`` with a calculator tool.

    Actions: ``calc: <expression>`` (observation: ``calc result: <value>`` or ``calc error: ...``)
    or ``answer: <integer>`` (ends the episode; reward 1.0 if right). Anything else is invalid
    (``info["invalid_action"]``, reward 0). Every action uses one of ``max_steps``; running out
    truncates the episode with reward 0.
    """

    def __init__(self, max_steps: int = 4, digits: int = 3, render_mode: str | None = None
                 ) -> None:
        super().__init__(render_mode=render_mode, max_obs_chars=1024, max_action_chars=48)
        self.max_steps = max_steps
        self.digits = digits
        self.expression = ""
        self.last_result: str | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        lo, hi = 10 ** (self.digits - 1), 10**self.digits
        a, b, c, d = (int(x) for x in self.np_random.integers(lo, hi, size=4))
        self.expression = f"{a}*{b}+{c}*{d}"
        self.answer = a * b + c * d
        self.steps, self.last_result, self._over = 0, None, False
        obs = (f"Compute {self.expression}. Reply 'calc: <expression>' to use the calculator or "
               "'answer: <number>' to answer.")
        return obs, {"expression": self.expression}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._over:
            return self._after_end()
        self.steps += 1
        text = (action_text(action) or "").strip()
        kind, _, arg = text.partition(":")
        kind = kind.strip().lower()
        info: dict[str, Any] = {"invalid_action": False}
        if kind == "answer":
            got = re.fullmatch(r"\s*(-?\d{1,40})\s*\.?\s*", arg)
            correct = got is not None and int(got.group(1)) == self.answer
            self._over = True
            info.update(answer=str(self.answer), correct=correct)
            return "", float(correct), True, False, info
        if kind == "calc":
            try:
                self.last_result = f"calc result: {calculate(arg)}"
            except ValueError as exc:
                self.last_result = f"calc error: {exc}"
            obs = self.last_result
        else:
            info["invalid_action"] = True
            obs = "Invalid action. Reply 'calc: <expression>' or 'answer: <number>'."
        truncated = self.steps >= self.max_steps
        self._over = truncated
        return self._obs(obs), 0.0, False, truncated, info

    def observe_struct(self) -> dict[str, Any]:
        return {"expression": self.expression, "last_result": self.last_result}

    def _render(self) -> str:
        return f"{self.expression} (step {getattr(self, 'steps', 0)}/{self.max_steps})"


# ----------------------------------------------------------------------------- recall
_WORDS = ("amber", "basil", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo",
          "juniper", "kelp", "lumen", "maple", "nectar", "onyx", "pepper")


class RecallEnv(_OneShot):
    """Answers that only earlier episodes reveal (for memory banks).

    Args:
        world_seed: Seeds the hidden world of ``num_facts`` key -> 4-digit code facts; the same
            world holds across episodes (episode seeds only pick which key is asked).
        num_facts: Number of facts in the world.

    The final step's ``info["revealed"]`` is ``{"key": k, "value": v}`` and the terminal
    observation says "The code of 'k' is v." Reward 1.0 when the reply contains the right code.
    """

    def __init__(self, world_seed: int = 0, num_facts: int = 16, render_mode: str | None = None
                 ) -> None:
        super().__init__(render_mode=render_mode, max_obs_chars=512, max_action_chars=16)
        rng = np.random.default_rng(world_seed)
        keys: list[str] = []
        while len(keys) < num_facts:
            key = f"{_WORDS[int(rng.integers(len(_WORDS)))]}-{int(rng.integers(10, 100))}"
            if key not in keys:
                keys.append(key)
        self.world = {k: str(int(rng.integers(1000, 10000))) for k in keys}
        self.keys = keys
        self.key = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        key = (options or {}).get("key")
        if key not in self.world:
            key = self.keys[int(self.np_random.integers(len(self.keys)))]
        self.key = key
        self._over = False
        return f"What is the code of '{self.key}'? Reply with the 4-digit code.", {"key": self.key}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._over:
            return self._after_end()
        text = action_text(action) or ""
        value = self.world[self.key]
        codes = re.findall(r"(?<!\d)\d{4}(?!\d)", text[:200])
        correct = bool(codes) and codes[0] == value
        self._over = True
        info = {"revealed": {"key": self.key, "value": value}, "correct": correct,
                "invalid_action": False}
        return f"The code of '{self.key}' is {value}.", float(correct), True, False, info

    def observe_struct(self) -> dict[str, Any]:
        return {"key": self.key}

    def _render(self) -> str:
        return f"asking {self.key!r}"
