"""A task family of your own, in one file: subtask types, the family, and a decomposer run.

The task: "sum of the 2 largest of 3 8 5 1". The rule plan is ``sort > top > sum``: a sorter
orders the numbers, a picker keeps the first k, an adder sums them; each step is verified on what
its own observation shows, and the whole task's answer is the last step's output. Observations
read the task's text (its data, the facts the verifiers check, is sealed for them).

    .venv/bin/python examples/custom_family.py            # trains a sorter and a calculator
"""

from __future__ import annotations

import random

from agentrt.decomposer.plan import Plan
from agentrt.decomposer.sdk import (FAMILIES, FamilyOptions, StepContext, SubtaskType, Task,
                                    TaskFamily, Verdict)


def numbers(text: str) -> list[int] | None:
    """The integers of ``text`` if it holds nothing else."""
    parts = text.split()
    return [int(p) for p in parts] if parts and all(p.isdigit() for p in parts) else None


def read(text: str) -> tuple[int, list[int]]:
    """(k, numbers) of "sum of the <k> largest of <numbers>"."""
    words = text.split()
    return int(words[3]), [int(w) for w in words[6:]]


def _sort_verify(ctx: StepContext, out: str) -> Verdict:
    want = sorted(ctx.task.data["xs"], reverse=True)
    return Verdict(numbers(out) == want, f"expected {' '.join(map(str, want))}")


def _top_observe(ctx: StepContext) -> str:
    return f"top {read(ctx.task.text)[0]} of {ctx.inputs[0].strip()}\n"


def _top_reference(ctx: StepContext) -> str:
    xs = numbers(ctx.inputs[0]) or []
    return " ".join(map(str, xs[:ctx.task.data["k"]]))


def _sum_verify(ctx: StepContext, out: str) -> Verdict:
    xs = numbers(ctx.inputs[0]) or []
    return Verdict(out.strip() == str(sum(xs)), f"the sum is {sum(xs)}")


SORT = SubtaskType("sort", "the numbers from largest to smallest",
                   observe=lambda ctx: f"sort {' '.join(map(str, read(ctx.task.text)[1]))}\n",
                   verify=_sort_verify,
                   reference=lambda ctx: " ".join(map(str, sorted(ctx.task.data["xs"],
                                                                  reverse=True))),
                   max_tokens=12)
TOP = SubtaskType("top", "the first k numbers of a list", observe=_top_observe,
                  verify=lambda ctx, out: out.strip() == _top_reference(ctx),
                  reference=_top_reference, max_tokens=8)
SUM = SubtaskType("sum", "the sum of a list", observe=lambda ctx: f"sum {ctx.inputs[0].strip()}\n",
                  verify=_sum_verify,
                  reference=lambda ctx: str(sum(numbers(ctx.inputs[0]) or [])), max_tokens=4)


class TopSumOptions(FamilyOptions):
    size: int = 4  # numbers per task


@FAMILIES.register("topsum")
class TopSum(TaskFamily):
    subtask_types = (SORT, TOP, SUM)
    options_model = TopSumOptions

    def make_task(self, rng: random.Random, index: int) -> Task:
        xs = [rng.randint(0, 9) for _ in range(self.options.size)]
        k = rng.randint(2, 3)
        return Task(f"topsum/{index}", f"sum of the {k} largest of {' '.join(map(str, xs))}",
                    {"xs": xs, "k": k})

    def rule_plan(self, task: Task) -> Plan:
        return Plan.chain(["sort", "top", "sum"])

    def verify(self, task: Task, answer: str) -> Verdict:
        want = sum(sorted(task.data["xs"], reverse=True)[:task.data["k"]])
        return Verdict(answer.strip() == str(want), f"expected {want}")


def top_tool(request) -> str:
    """A Python specialist (a 'tool'): routed like any policy, never trained."""
    text = request.observation.split()  # "top <k> of <numbers...>"
    return " ".join(text[3:3 + int(text[1])])


def main() -> None:
    from agentrt.config.load import validate_config
    from agentrt.decomposer.config import DecomposeConfig
    from agentrt.decomposer.workload import Decomposer

    lm = {"model": {"preset": "llama-tiny"}, "micro_batch_size": 256,
          "rollout": {"sampling": {"max_new_tokens": 16}},
          "algorithm": {"name": "grpo", "kl": {"coef": 0.0}}, "optim": {"lr": 5e-5}}
    cfg = validate_config({
        "run_dir": "runs/topsum", "family": {"name": "topsum", "train_size": 2000,
                                             "eval_size": 100},
        "planner": {"kind": "rule"},
        "policies": [{"id": "sorter", "skills": ["sort"], **lm},
                     {"id": "adder", "skills": ["sum"], **lm}],
        "tools": [{"id": "picker", "fn": "__main__:top_tool", "skills": ["top"]}],
        "sft": {"steps": 150, "batch_size": 64, "lr": 1e-3},
        "train": {"steps": 10, "tasks_per_step": 16, "group_size": 4},
        "eval": {"every": 5}}, DecomposeConfig)
    last = Decomposer(cfg).run()
    print(f"held-out task success {last['eval/success']:.2f}; report: runs/topsum/report.html")


if __name__ == "__main__":
    main()
