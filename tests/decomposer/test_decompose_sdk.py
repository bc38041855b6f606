"""The SDK example (examples/custom_family.py) works as documented, and the decomposer's credit:
specialists get their subtask reward plus a share of the outcome with baselines per (subtask
type, policy), the planner the outcome with a baseline per task; chains of a step are batched."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from agentrt.config.load import validate_config
from agentrt.decomposer.config import DecomposeConfig
from agentrt.decomposer.workload import Decomposer
from agentrt.envs.registration import make_multi
from agentrt.runner.core import ROUTED, EpisodeRunner, EpisodeSpec, RunnerConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def custom():
    spec = importlib.util.spec_from_file_location("custom_family", ROOT / "examples" /
                                                  "custom_family.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["custom_family"] = module
    spec.loader.exec_module(module)
    return module


def test_custom_family_chains_solve_with_reference_specialists(custom):
    env = make_multi("Decompose-v0", family="topsum", planner="rule", train_size=50, eval_size=10)
    fam = env.family
    solved = 0
    for i in range(20):
        env.reset(seed=i, options={"index": i})
        outputs = fam.reference_outputs(env.task, env.plan)
        while not env.done:
            env.step(outputs[env.step_now.id])
        chain = env.infos["a0"]["chain"]
        solved += chain["success"]
        assert [s["type"] for s in chain["steps"]] == ["sort", "top", "sum"]
    assert solved == 20
    # A wrong sum fails with the verifier's reason and ends the chain.
    env.reset(seed=0, options={"index": 0})
    outputs = fam.reference_outputs(env.task, env.plan)
    env.step(outputs[0]), env.step(outputs[1]), env.step("999")
    chain = env.infos["a0"]["chain"]
    assert chain["outcome"] == "subtask_failed" and "the sum is" in chain["reason"]


def test_tool_specialists_route_through_the_runner(custom):
    """Scripted specialists (the example's tool and two reference callables) through the real
    runner: every chain of a batch is played at once and each is solved."""
    env = make_multi("Decompose-v0", family="topsum", planner="rule", train_size=50, eval_size=10)

    def reference(req):
        e = req._env  # the example's callables only need the observation; this one cheats
        return e.family.reference_outputs(e.task, e.plan)[e.step_now.id]

    kinds = {"sort": "ref_sort", "top": "picker", "sum": "ref_sum"}
    runner = EpisodeRunner({"ref_sort": reference, "ref_sum": reference,
                            "picker": custom.top_tool},
                           RunnerConfig(random_seats=False, policy_errors="record"),
                           route=lambda e, agent: kinds[e.subtask(agent)])
    kwargs = {"family": "topsum", "planner": "rule", "train_size": 50, "eval_size": 10}
    seats = (ROUTED,) * len(env.possible_agents)
    result = runner.run([EpisodeSpec("Decompose-v0", seats, seed=i, env_kwargs=kwargs,
                                     options={"index": i}) for i in range(16)])
    chains = [r.final_infos["a0"]["chain"] for r in result.episodes]
    assert all(c["success"] for c in chains)
    assert result.metrics["rollout/batch_mean/picker"] == 16  # one call for all 16 chains
    assert {r.seats["a1"] for r in result.episodes} == {"picker"}


def test_credit_and_baseline_groups(tmp_path):
    """One RL step of an LM planner and two LM specialists: the trajectories the objective gets
    carry the env's two-level credit and never share a baseline group across types/policies."""
    lm = {"model": {"preset": "llama-tiny"}, "micro_batch_size": 64,
          "rollout": {"sampling": {"max_new_tokens": 12}},
          "algorithm": {"name": "grpo", "kl": {"coef": 0.0}}}
    cfg = validate_config({
        "run_dir": str(tmp_path / "run"), "progress": False,
        "family": {"name": "wordchain", "train_size": 100, "eval_size": 4},
        "planner": {"kind": "rule"}, "chain": {"on_failure": "continue", "outcome_share": 0.25},
        "policies": [{"id": "reader", "skills": ["parse", "format"], **lm},
                     {"id": "calc", "skills": ["add", "sub", "mul", "div"], **lm}],
        "train": {"steps": 1, "tasks_per_step": 3, "group_size": 2}}, DecomposeConfig)
    runner = Decomposer(cfg)
    work, ctl = runner.workload, runner.controller
    try:
        work.start(ctl)
        played = ctl.play(work, work.next_episodes(1))
        data = work.training_data(played, 1)
    finally:
        ctl.shutdown()
    assert set(data) == {"reader", "calc"}
    chains = {r.episode_id: r.final_infos["a0"]["chain"] for r in played.episodes}
    skills = {"reader": ("parse", "format"), "calc": ("add", "sub", "mul", "div")}
    for pid, trajs in data.items():
        assert len(trajs) == sum(s["type"] in skills[pid] for c in chains.values()
                                 for s in c["steps"])  # on_failure: continue -> every step
        kinds = {t.info["final_info"]["subtask"] for t in trajs}
        assert len({t.group_id for t in trajs}) == len(kinds)  # one group per subtask type
        for t in trajs:
            kind = t.info["final_info"]["subtask"]
            assert (t.group_id.role, t.group_id.policy, t.group_id.task) == (kind, pid, None)
            chain = chains[t.episode_id]
            step = next(s for s in chain["steps"] if s["agent"] == t.role)
            assert t.reward == pytest.approx(step["reward"] + 0.25 * chain["success"])
    assert played.metrics["rollout/batch_mean/reader"] == 6  # 6 chains' parse steps at once
