"""The router on real Decompose-v0 chains played by the episode runner.

Scripted specialists (plain callables) do the word-chain subtasks; the router binds each attempt
agent when it first acts and learns from the chains' final infos after each batch (one batch =
one training step, all its chains routed before any outcome is known).

- must-show 3: exploration on vs off (two parse specialists, one clearly better);
- must-show 4: routing that reads memory of past outcomes picks the better specialist more often
  (two parse specialists, each right on half of the problem templates);
- resume, errors and metric names.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any, Callable

import pytest

from agentrt.decomposer.families.wordchain import OPS
from agentrt.decomposer.router import Router, RouterConfig, RoutingError
from agentrt.decomposer.sdk import make_family
from agentrt.runner.core import EpisodeRunner, EpisodeSpec, RunnerConfig

ENV_KWARGS = {"family": "wordchain", "train_size": 600, "eval_size": 8, "seed": 11}
BATCH = 32
SKILLS_OF = {name: t.skills for name, t in make_family("wordchain").types.items()}
CALC_SKILLS = ("add", "sub", "mul", "div", "format")
FIGURES: dict[str, Any] = {}  # what the tests measured, printed at the end of each


# ---------------------------------------------------------------------- scripted specialists
def calc(req: Any) -> str:
    """Always right on the arithmetic and format steps."""
    words = req.observation.strip().splitlines()[-1].split()
    if words[0] == "format":
        return " ".join(words[1:])
    if "?" in words:
        return "0"
    return str(OPS[words[0]](int(words[1]), int(words[2])))


def parser(right: Callable[[str], bool]) -> Callable[[Any], str]:
    """A parse specialist that is right exactly on the observations ``right`` accepts (else it
    misses the last quantity)."""
    def act(req: Any) -> str:
        numbers = re.findall(r"\d+", req.observation)
        return " ".join(numbers if right(req.observation) else numbers[:-1])
    return act


def coin(percent: int) -> Callable[[str], bool]:
    """Right on a fixed ``percent`` of observations (a hash of the text, so deterministic)."""
    return lambda obs: zlib.crc32(obs.encode()) % 100 < percent


def template_a(obs: str) -> bool:
    """Three of the six word-chain templates (the other specialist is right on the rest)."""
    return any(w in obs for w in (" bags ", " rows ", " loses "))


# ---------------------------------------------------------------------- playing batches
def play(router: Router, policies: dict[str, Any], batches: int,
         watch: str = "parse") -> list[dict[str, Any]]:
    """Plays ``batches`` batches of chains, recording outcomes after each; returns per batch the
    watched type's traffic per policy, its successes and whether it was separated when routed."""
    seen: dict[tuple[str, str], str] = {}

    def route(env: Any, agent: str) -> str:
        obs = env.observe(agent)
        seen[(env.task.id, agent)] = obs  # the chain's steps do not carry the observation
        return router.route(env.subtask(agent), obs)

    runner = EpisodeRunner(policies, RunnerConfig(random_seats=False, policy_errors="record",
                                                  max_turns=16), route=route)
    n_agents = 1 + 6  # planner + a0..a5 (max_subtasks=6, no repairs)
    rows = []
    for b in range(batches):
        separated = router.separated(watch)
        seen.clear()
        specs = [EpisodeSpec("Decompose-v0", ("*",) * n_agents, seed=i, env_kwargs=ENV_KWARGS,
                             options={"index": i}) for i in range(b * BATCH, (b + 1) * BATCH)]
        traffic: dict[str, int] = {}
        ok = 0
        for rec in runner.run(specs).episodes:
            chain = next(iter(rec.final_infos.values()))["chain"]
            for step in chain["steps"]:
                pid = rec.seats[step["agent"]]
                router.record(step["type"], seen[(chain["task_id"], step["agent"])], pid,
                              step["ok"], step=b)
                if step["type"] == watch:
                    traffic[pid] = traffic.get(pid, 0) + 1
                    ok += step["ok"]
        total = sum(traffic.values())
        rows.append({"separated": separated, "traffic": traffic, "ok": ok / total,
                     "max_share": max(traffic.values()) / total,
                     "entropy": router.metrics()[f"routing/entropy/{watch}"]})
    return rows


def router_for(specialists: dict[str, tuple[str, ...]], **cfg: Any) -> Router:
    return Router(RouterConfig(**cfg), specialists, SKILLS_OF, seed=3)


# ---------------------------------------------------------------------- must-show 3
GOOD_BAD_SKILLS = {"parse_bad": ("parse",), "parse_good": ("parse",), "calc": CALC_SKILLS}
PAIRS = {"clear": (90, 30), "close": (70, 50)}  # % of parse steps each specialist gets right


def good_bad(pair: str) -> dict[str, Any]:
    good, bad = PAIRS[pair]
    return {"parse_bad": parser(coin(bad)), "parse_good": parser(coin(good)), "calc": calc}


def exploration_run(mode: str, pair: str = "clear", batches: int = 10) -> dict[str, Any]:
    router = router_for(GOOD_BAD_SKILLS, exploration=mode)
    rows = play(router, good_bad(pair), batches)
    before = [r for r in rows if not r["separated"]]
    after = [r for r in rows if r["separated"]]
    good_after = sum(r["traffic"].get("parse_good", 0) for r in after)
    figures = {
        "batches_before_separation": len(before),
        "max_share_before_separation": max(r["max_share"] for r in before),
        "min_entropy_before_separation": round(min(r["entropy"] for r in before), 3),
        "good_share_after_separation": good_after / (BATCH * len(after)) if after else None,
        "entropy_per_batch": [round(r["entropy"], 3) for r in rows],
        "parse_success": sum(r["ok"] for r in rows) / len(rows),
        "separated_at_end": router.separated("parse"),
    }
    FIGURES[f"exploration={mode},{pair}"] = figures
    print(f"\nexploration={mode} {pair} {PAIRS[pair]}: {json.dumps(figures)}")
    return figures


@pytest.mark.parametrize("pair", ["clear", "close"])
@pytest.mark.parametrize("mode", ["ucb", "epsilon"])
def test_exploration_spreads_traffic_until_the_ratings_separate(mode: str, pair: str) -> None:
    f = exploration_run(mode, pair, batches=10 if pair == "clear" else 12)
    assert f["batches_before_separation"] >= 1
    assert f["max_share_before_separation"] <= 0.8
    assert f["min_entropy_before_separation"] > 0.8  # bits; 1 is an even split of two
    if pair == "clear":
        assert f["separated_at_end"], "the ratings of a 90% and a 30% specialist never separated"
    if f["good_share_after_separation"] is not None:
        assert f["good_share_after_separation"] >= 0.85


@pytest.mark.parametrize("pair", ["clear", "close"])
def test_routing_without_exploration_collapses(pair: str) -> None:
    f = exploration_run("none", pair)
    assert f["max_share_before_separation"] > 0.8
    assert f["entropy_per_batch"][0] == 0.0  # the whole first batch went to one policy


# ---------------------------------------------------------------------- must-show 4
SPLIT = {"parse_a": parser(template_a), "parse_b": parser(lambda o: not template_a(o)),
         "calc": calc}
SPLIT_SKILLS = {"parse_a": ("parse",), "parse_b": ("parse",), "calc": CALC_SKILLS}


@pytest.mark.parametrize("mode", ["ucb", "epsilon"])
def test_memory_of_past_outcomes_picks_the_better_specialist(mode: str) -> None:
    # Each parse specialist is right on exactly the templates the other gets wrong, so a parse
    # step succeeds iff the router picked the better one: success = better-pick fraction.
    picked = {}
    for memory in (False, True):
        router = router_for(SPLIT_SKILLS, exploration=mode, memory=memory)
        rows = play(router, SPLIT, batches=6)
        picked[memory] = sum(r["ok"] for r in rows[1:]) / len(rows[1:])  # after batch 0
        FIGURES[f"memory={memory},{mode}"] = {
            "better_pick_per_batch": [round(r["ok"], 3) for r in rows],
            "separated": router.separated("parse")}
        assert router.bank is None or router.bank.count() > 0
    print(f"\nbetter pick ({mode}) with memory {picked[True]:.3f}, without {picked[False]:.3f}; "
          f"{json.dumps({k: v for k, v in FIGURES.items() if k.endswith(mode)})}")
    assert picked[True] >= picked[False] + 0.25
    assert picked[True] >= 0.8


# ---------------------------------------------------------------------- resume, errors, names
def decisions(router: Router, n: int = 40) -> list[str]:
    family = make_family("wordchain")
    tasks, _ = family.splits(n, 1, seed=5)
    return [router.route("parse", f"parse: {t.text}\n") for t in tasks]


@pytest.mark.parametrize("mode", ["ucb", "epsilon"])
def test_resume_makes_the_same_next_decisions(mode: str, tmp_path) -> None:
    cfg = {"exploration": mode, "memory": True, "epsilon": 0.3}
    live = Router(RouterConfig(**cfg), SPLIT_SKILLS, SKILLS_OF, seed=3,
                  memory_path=tmp_path / "live")
    play(live, SPLIT, batches=2)
    decisions(live, 5)  # in flight when the state is taken (a checkpoint mid-step)
    state = json.loads(json.dumps(live.state_dict()))
    fresh = Router(RouterConfig(**cfg), SPLIT_SKILLS, SKILLS_OF, seed=99)
    fresh.load_state_dict(state)
    expected = decisions(live)
    assert decisions(fresh) == expected
    assert fresh.metrics() == live.metrics() and fresh.history() == live.history()
    # The live router's folder got ahead of the state (more outcomes written): reopening it and
    # loading the state drops those, so the decisions are again the same.
    play(live, SPLIT, batches=1)
    live.close()
    reopened = Router(RouterConfig(**cfg), SPLIT_SKILLS, SKILLS_OF, memory_path=tmp_path / "live")
    assert reopened.bank.count() > len(state["memory"])
    reopened.load_state_dict(state)
    assert reopened.bank.count() == len(state["memory"])
    assert decisions(reopened) == expected


def test_unknown_type_and_unknown_policy_are_clear_errors() -> None:
    router = router_for(GOOD_BAD_SKILLS)
    with pytest.raises(RoutingError, match="'solve'.*skills solve"):
        router.route("solve", "solve: tom has 3 bags")
    with pytest.raises(RoutingError, match="unknown policy 'nobody'"):
        router.record("parse", "parse: x", "nobody", True, step=0)
    with pytest.raises(ValueError, match="unknown embedder"):
        RouterConfig(embedder="nope")
    with pytest.raises(ValueError, match="extra"):
        RouterConfig(exploraton="ucb")


def test_metric_names_matrix_and_history() -> None:
    router = router_for(GOOD_BAD_SKILLS)
    play(router, good_bad("clear"), batches=2)
    m = router.metrics()
    types = ("parse", "add", "sub", "mul", "div", "format")
    expected = {f"routing/load/{p}" for p in GOOD_BAD_SKILLS}
    expected |= {f"routing/entropy/{t}" for t in types} | {f"routing/separated/{t}" for t in types}
    expected |= {f"routing/success/{t}/calc" for t in types if t != "parse"}
    expected |= {f"routing/success/parse/{p}" for p in ("parse_bad", "parse_good")}
    assert set(m) == expected
    assert abs(sum(m[f"routing/load/{p}"] for p in GOOD_BAD_SKILLS) - 1.0) < 1e-9
    assert m["routing/separated/mul"] == 1.0 and m["routing/entropy/mul"] == 0.0
    assert sum(router.matrix()["parse"].values()) == 2 * BATCH
    assert {r["step"] for r in router.history()} == {0, 1}
    assert sum(r["routed"] for r in router.history() if r["type"] == "parse") == 2 * BATCH


def test_greedy_routing_for_evaluation_leaves_the_router_as_it_was() -> None:
    router = router_for(GOOD_BAD_SKILLS, exploration="epsilon", epsilon=0.5)
    play(router, good_bad("clear"), batches=2)
    before = json.dumps(router.state_dict())
    picks = {router.route("parse", f"parse: task {i}\n", explore=False) for i in range(20)}
    assert picks == {"parse_good"}
    assert router.route("parse", "parse: x\n", frozenset({"parse_good"}), False) == "parse_bad"
    everyone = frozenset(GOOD_BAD_SKILLS)
    assert router.route("parse", "parse: x\n", everyone, explore=False) == "parse_good"
    assert json.dumps(router.state_dict()) == before  # nothing in flight, no rng draw
