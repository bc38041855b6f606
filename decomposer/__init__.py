"""agentrt.decomposer: long tasks split into subtask chains, each subtask routed to a specialist
policy, the planner and every specialist trained (docs/decomposer.md).

- :mod:`.sdk`: subtask types and task families (what a user defines);
- :mod:`.plan`: the plan format and its validation;
- :mod:`.env`: ``Decompose-v0`` (a task as a chain of routed subtasks) and the whole-task envs;
- :mod:`.router`: routing by skills, ratings and memory of past outcomes, with exploration;
- :mod:`.workload`: the decomposer's scheduler on the controller loop (``agentrt decompose run``).
"""

from agentrt.decomposer.plan import Plan, PlanError, Step, format_plan, parse_plan
from agentrt.decomposer.sdk import (FAMILIES, WHOLE, FamilyOptions, HiddenFieldError,
                                    StepContext, SubtaskType, Task, TaskFamily, Verdict,
                                    make_family, visible)

# Registers the built-in families (word chains, event plans, shopping bills) in FAMILIES: every module of the
# package, sdk included, is imported after this file, so make_family always finds them.
from agentrt.decomposer.families import eventplan, shopping, wordchain  # noqa: F401

__all__ = ["FAMILIES", "WHOLE", "FamilyOptions", "HiddenFieldError", "Plan", "PlanError", "Step",
           "StepContext", "SubtaskType", "Task", "TaskFamily", "Verdict", "format_plan",
           "make_family", "parse_plan", "visible"]
