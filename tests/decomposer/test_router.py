"""The router on real Decompose-v0 chains played by the episode runner.

The scripted-specialist scenarios live in ``routing_sim.py`` (shared with
``bench/decomposer_routing.py``, which prints their figures side by side); these tests assert them.

- must-show 3: exploration on vs off (two parse specialists, one clearly better);
- must-show 4: routing that reads memory of past outcomes picks the better specialist more often
  (two parse specialists, each right on half of the problem templates);
- resume, errors and metric names.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrt.decomposer.router import Router, RouterConfig, RoutingError
from agentrt.decomposer.sdk import make_family
from routing_sim import (BATCH, GOOD_BAD_SKILLS, PAIRS, SKILLS_OF, SPLIT, SPLIT_SKILLS,
                         exploration_run, good_bad, memory_run, play, router_for)

FIGURES: dict[str, Any] = {}  # what the tests measured, printed at the end of each


# ---------------------------------------------------------------------- must-show 3
def measured(mode: str, pair: str, batches: int = 10) -> dict[str, Any]:
    figures = exploration_run(mode, pair, batches)
    FIGURES[f"exploration={mode},{pair}"] = figures
    print(f"\nexploration={mode} {pair} {PAIRS[pair]}: {json.dumps(figures)}")
    return figures


@pytest.mark.parametrize("pair", ["clear", "close"])
@pytest.mark.parametrize("mode", ["ucb", "epsilon"])
def test_exploration_spreads_traffic_until_the_ratings_separate(mode: str, pair: str) -> None:
    f = measured(mode, pair, batches=10 if pair == "clear" else 12)
    assert f["batches_before_separation"] >= 1
    assert f["max_share_before_separation"] <= 0.8
    assert f["min_entropy_before_separation"] > 0.8  # bits; 1 is an even split of two
    if pair == "clear":
        assert f["separated_at_end"], "the ratings of a 90% and a 30% specialist never separated"
    if f["good_share_after_separation"] is not None:
        assert f["good_share_after_separation"] >= 0.85


@pytest.mark.parametrize("pair", ["clear", "close"])
def test_routing_without_exploration_collapses(pair: str) -> None:
    f = measured("none", pair)
    assert f["max_share_before_separation"] > 0.8
    assert f["entropy_per_batch"][0] == 0.0  # the whole first batch went to one policy


# ---------------------------------------------------------------------- must-show 4
@pytest.mark.parametrize("mode", ["ucb", "epsilon"])
def test_memory_of_past_outcomes_picks_the_better_specialist(mode: str) -> None:
    # Each parse specialist is right on exactly the templates the other gets wrong, so a parse
    # step succeeds iff the router picked the better one: success = better-pick fraction.
    picked = {}
    for memory in (False, True):
        f = memory_run(mode, memory, batches=6)
        picked[memory] = f["better_pick"]  # after batch 0
        FIGURES[f"memory={memory},{mode}"] = {
            "better_pick_per_batch": f["better_pick_per_batch"], "separated": f["separated"]}
        assert f["memory_records"] is None or f["memory_records"] > 0
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


def test_memory_keeps_the_newest_outcomes_up_to_its_size(tmp_path) -> None:
    cfg = RouterConfig(exploration="epsilon", memory=True, memory_size=7)
    router = Router(cfg, SPLIT_SKILLS, SKILLS_OF, memory_path=tmp_path / "bank")
    for i in range(10):
        router.record("parse", f"parse: task {i}\n", "parse_a", True, step=0)
    assert [r.text for r in router.bank.records()] == [f"parse: task {i}\n" for i in range(3, 10)]
    state = json.loads(json.dumps(router.state_dict()))
    assert len(state["memory"]) == 7
    resumed = Router(cfg, SPLIT_SKILLS, SKILLS_OF)
    resumed.load_state_dict(state)
    for i in range(10, 13):  # the resumed router forgets in the same order
        resumed.record("parse", f"parse: task {i}\n", "parse_a", True, step=1)
    assert [r.text for r in resumed.bank.records()] == [f"parse: task {i}\n"
                                                        for i in range(6, 13)]


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
