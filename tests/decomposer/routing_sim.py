"""Scripted-specialist routing scenarios on real Decompose-v0 chains, shared by the router tests
and ``bench/decomposer_routing.py``.

Scripted specialists (plain callables) do the word-chain subtasks; the router binds each attempt
agent when it first acts and learns from the chains' final infos after each batch (one batch =
one training step, all its chains routed before any outcome is known).

- :func:`exploration_run` (must-show 3): two parse specialists, one better (``PAIRS``), with
  exploration ``ucb``, ``epsilon`` or ``none``;
- :func:`memory_run` (must-show 4): two parse specialists, each right on exactly the templates
  the other gets wrong, routed with or without memory of past outcomes.

Everything is deterministic (fixed seeds, specialists right on a hash of the text).
"""

from __future__ import annotations

import re
import zlib
from typing import Any, Callable

from agentrt.decomposer.families.wordchain import OPS
from decompose_tools import formatted  # this folder is on sys.path (pytest, the bench)
from agentrt.decomposer.router import Router, RouterConfig
from agentrt.decomposer.sdk import make_family
from agentrt.runner.core import EpisodeRunner, EpisodeSpec, RunnerConfig

ENV_KWARGS = {"family": "wordchain", "train_size": 600, "eval_size": 8, "seed": 11}
BATCH = 32
SKILLS_OF = {name: t.skills for name, t in make_family("wordchain").types.items()}
CALC_SKILLS = ("add", "sub", "mul", "div", "format")


# ---------------------------------------------------------------------- scripted specialists
def calc(req: Any) -> str:
    """Always right on the arithmetic and format steps."""
    words = req.observation.strip().splitlines()[-1].split()
    if words[0] == "format":
        return formatted(words)
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
    watched type's traffic per policy, its success rate, the largest share of one policy, the
    routing entropy (bits) and whether the type was separated when the batch was routed."""
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
    """Routes ``batches`` batches of chains to the ``pair``'s parse specialists with
    exploration ``mode``; returns the figures of the parse type.

    "Before separation" is the batches routed while the parse ratings were not yet separated
    (every batch, if they never separate); the figures over them are None when there are none.
    Shares are fractions of one batch's parse steps; entropy is in bits (1 = an even split).
    """
    router = router_for(GOOD_BAD_SKILLS, exploration=mode)
    rows = play(router, good_bad(pair), batches)
    before = [r for r in rows if not r["separated"]]
    after = [r for r in rows if r["separated"]]
    good_after = sum(r["traffic"].get("parse_good", 0) for r in after)
    return {
        "batches_before_separation": len(before),
        "max_share_before_separation": max((r["max_share"] for r in before), default=None),
        "min_entropy_before_separation":
            round(min(r["entropy"] for r in before), 3) if before else None,
        "mean_entropy_before_separation":
            round(sum(r["entropy"] for r in before) / len(before), 3) if before else None,
        "good_share_after_separation":
            good_after / sum(sum(r["traffic"].values()) for r in after) if after else None,
        "entropy_per_batch": [round(r["entropy"], 3) for r in rows],
        "parse_success": sum(r["ok"] for r in rows) / len(rows),
        "separated_at_end": router.separated("parse"),
    }


# ---------------------------------------------------------------------- must-show 4
SPLIT = {"parse_a": parser(template_a), "parse_b": parser(lambda o: not template_a(o)),
         "calc": calc}
SPLIT_SKILLS = {"parse_a": ("parse",), "parse_b": ("parse",), "calc": CALC_SKILLS}


def memory_run(mode: str, memory: bool, batches: int = 6) -> dict[str, Any]:
    """Routes ``batches`` batches of chains to the two split parse specialists with exploration
    ``mode``, reading memory of past outcomes or not; returns the figures of the parse type.

    Each specialist is right on exactly the templates the other gets wrong, so a parse step
    succeeds iff the router picked the better one: success = better-pick fraction.
    ``better_pick`` averages it over the batches after the first (batch 0 has no past
    outcomes to read); ``memory_records`` is the bank's size at the end (None without memory).
    """
    router = router_for(SPLIT_SKILLS, exploration=mode, memory=memory)
    rows = play(router, SPLIT, batches)
    return {
        "better_pick": sum(r["ok"] for r in rows[1:]) / len(rows[1:]),
        "better_pick_per_batch": [round(r["ok"], 3) for r in rows],
        "separated": router.separated("parse"),
        "memory_records": None if router.bank is None else router.bank.count(),
    }
