"""``check_multiagent_env``: the multi-agent counterpart of Gymnasium's ``check_env``.

It plays a few seeded games with random legal actions and checks the API shapes, that the same
seed replays the same game exactly, that garbage actions (None, empty, huge, non-UTF-8 bytes,
out-of-range moves) neither raise nor change the state but are flagged invalid, and rendering.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from agentrt.envs.core import MultiAgentEnv

FREE_TEXT_ACTIONS = ("hello", "[accept]", "[propose 1 1 1]", "ok, deal?", "1", "yes")
ActionFn = Callable[[MultiAgentEnv, random.Random], Any]


def _garbage(env: MultiAgentEnv, free_text: bool) -> list[Any]:
    always = [None, "", "x" * (env.max_action_chars + 1), 3.5, object()]
    if free_text:
        return always
    return always + [b"\xff\xfe\xfd", "99999", "-1", "  ", "\x00", "\udcff", "[[]]"]


def _snapshot(env: MultiAgentEnv, actor: str) -> tuple[Any, ...]:
    others = tuple(env.observe(a) for a in env.agents if a != actor)
    return (env.agent_selection, others, env.done, env.legal_actions(actor))


def _check_step_shapes(env: MultiAgentEnv) -> None:
    for name in ("rewards", "terminations", "truncations", "infos"):
        table = getattr(env, name)
        assert set(table) >= set(env.agents), f"env.{name} must have an entry for every agent"
    assert all(isinstance(r, float) for r in env.rewards.values()), "rewards must be floats"
    assert all(isinstance(v, bool) for v in env.terminations.values()), "terminations: bool"
    assert all(isinstance(v, bool) for v in env.truncations.values()), "truncations: bool"


def _check_garbage(env: MultiAgentEnv) -> None:
    actor = env.agent_selection
    legal = env.legal_actions(actor)
    before = _snapshot(env, actor)
    for bad in _garbage(env, legal is None):
        env.step(bad)
        assert env.infos[actor].get("invalid_action") is True, f"{bad!r} was not flagged invalid"
        assert all(r == 0.0 for r in env.rewards.values()), "an invalid action changed rewards"
        assert _snapshot(env, actor) == before, f"invalid action {bad!r} changed the state"
        assert isinstance(env.observe(actor), str)


def _play(env: MultiAgentEnv, seed: int, action_fn: ActionFn | None, max_steps: int,
          garbage: bool) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    assert env.reset(seed=seed) is None, "reset() must return None (PettingZoo AEC shape)"
    assert env.agents == list(env.possible_agents), "reset() must set agents = possible_agents"
    assert not env.done, "a new game must not be over"
    trace: list[tuple[Any, ...]] = []
    for step in range(max_steps):
        if env.done:
            return trace
        agent = env.agent_selection
        assert agent in env.agents, f"agent_selection {agent!r} is not an agent"
        obs = {a: env.observe(a) for a in env.agents}
        assert all(isinstance(o, str) for o in obs.values()), "observations must be str"
        legal = env.legal_actions(agent)
        assert legal is None or (legal and all(isinstance(x, str) for x in legal)), (
            "legal_actions must be a non-empty list of str (or None for free text)")
        assert env.infos[agent].get("legal_actions") == legal, "infos must carry legal_actions"
        assert all("legal_actions" not in env.infos[a] for a in env.agents if a != agent), (
            "only the agent to move may carry legal_actions in its info")
        if garbage and step < 3:
            _check_garbage(env)
        if legal is None:
            action = action_fn(env, rng) if action_fn else rng.choice(FREE_TEXT_ACTIONS)
        else:
            action = rng.choice(legal)
        env.step(action)
        _check_step_shapes(env)
        trace.append((agent, obs[agent], action, dict(env.rewards), env.done))
    raise AssertionError(f"the game did not end within {max_steps} steps")


def check_multiagent_env(env: MultiAgentEnv, seeds: tuple[int, ...] = (0, 1, 2),
                         action_fn: ActionFn | None = None, max_steps: int = 1000,
                         garbage: bool = True) -> None:
    """Raises AssertionError naming the first broken rule of the turn-based API.

    Args:
        env: The env to check (it is reset and played).
        seeds: One game per seed, each played twice to check determinism.
        action_fn: Picks actions in free-text envs (default: a few fixed phrases).
        max_steps: A game longer than this fails the check.
        garbage: Also check garbage actions at the first turns of every game.
    """
    assert isinstance(env, MultiAgentEnv), "env must subclass agentrt.envs.MultiAgentEnv"
    agents = list(env.possible_agents)
    assert agents and len(set(agents)) == len(agents), "possible_agents must be unique names"
    for seed in seeds:
        first = _play(env, seed, action_fn, max_steps, garbage)
        again = _play(env, seed, action_fn, max_steps, garbage=False)
        assert first == again, f"seed {seed} did not reproduce the same game"
        assert first, "a game must have at least one step"
    mode = env.render_mode
    env.render_mode = "ansi"
    try:
        assert isinstance(env.render(), str), "render() in 'ansi' mode must return str"
    finally:
        env.render_mode = mode
