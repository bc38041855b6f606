"""LM policy through the runner with a real tiny model: token-exact multi-turn trajectories,
batching, trainable-only data, memory context and context overflow."""

from __future__ import annotations

import pytest

from agentrt.config.rollout import RolloutConfig, SamplingConfig
from agentrt.config.sections import ModelConfig, PolicyConfig
from agentrt.runtime.learner import Learner
from agentrt.policies.lm import LMPolicy, PromptTemplate, bank_memory
from agentrt.policies.scripted import RandomPolicy
from agentrt.runner.core import EpisodeRunner, RunnerConfig, specs
from agentrt.core.types import GroupKey, collate

SHORT = PromptTemplate(first="{observation}\n> ", turn="\n{observation}\n> ")


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    cfg = PolicyConfig(id="lm", model=ModelConfig(path=str(tiny_model_dir)),
                       rollout=RolloutConfig(sampling=SamplingConfig(max_new_tokens=3)))
    return Learner(cfg, seed=0)


def _check_token_exact(traj) -> None:
    for prev, turn in zip(traj.turns, traj.turns[1:]):
        head = prev.prompt_ids + prev.response_ids
        assert turn.prompt_ids[: len(head)] == head, "a prompt must extend the previous turn"
    for turn in traj.turns:
        assert len(turn.logprobs) == len(turn.response_ids) > 0
        assert all(lp <= 0.0 for lp in turn.logprobs)


def test_self_play_gives_token_exact_per_role_trajectories(engine) -> None:
    # Bargaining takes any non-empty text, so an untrained model plays whole games.
    runner = EpisodeRunner({"lm": LMPolicy(engine, templates=SHORT)},
                           RunnerConfig(invalid_action="retry", max_retries=2, concurrency=6))
    result = runner.run(specs("Bargain-v0", ("lm", "lm"), 6, env_kwargs={"max_turns": 4}))
    trajs = result.trajectories
    assert len(trajs) == 12  # one per (episode, agent)
    assert all(len(t.turns) >= 2 for t in trajs), "each agent speaks at least twice"
    for t in trajs:
        _check_token_exact(t)
        assert t.group_id == GroupKey('Bargain-v0{"max_turns": 4}', t.role, "lm",
                                      opponents=("lm",))
        assert str(t.group_id) == f'Bargain-v0{{"max_turns": 4}}|{t.role}|lm|vs=lm'  # logged
        assert t.info["seat"] == int(t.role[-1])
        assert all(turn.role == t.role and turn.policy_id == "lm" for turn in t.turns)
        assert all(turn.policy_version == engine.version for turn in t.turns)
        assert t.reward == pytest.approx(t.info["return"])
        assert t.outcome in (0.0, 0.5, 1.0)
    batch = collate(trajs, pad_id=engine.pad_id)
    n_generated = sum(len(turn.response_ids) for t in trajs for turn in t.turns)
    assert batch.loss_mask.sum().item() == n_generated
    # Batched: one generate call per tick for all 6 games that wait on the policy.
    m = result.metrics
    assert m["rollout/calls/lm"] == max(r.num_actions for r in result.episodes)
    assert m["rollout/batch_mean/lm"] > 4


def test_only_trainable_policies_produce_training_data(engine) -> None:
    runner = EpisodeRunner({"lm": LMPolicy(engine, templates=SHORT), "rand": RandomPolicy(0),
                            "frozen": LMPolicy(engine, templates=SHORT, trainable=False)},
                           RunnerConfig(concurrency=8))
    result = runner.run(specs("KuhnPoker-v0", ("lm", "rand"), 4)
                        + specs("KuhnPoker-v0", ("frozen", "rand"), 4, seed=100))
    assert len(result.episodes) == 8
    assert {t.policy_id for t in result.trajectories} == {"lm"}
    assert len(result.trajectories) == 4
    seats = [t.info["seat"] for t in result.trajectories]
    assert set(seats) <= {0, 1} and all(t.info["opponents"] == ["rand"]
                                        for t in result.trajectories)


def test_tool_use_history_appends_tool_output_as_tokens(engine) -> None:
    policy = LMPolicy(engine, templates=SHORT)
    runner = EpisodeRunner({"lm": policy}, RunnerConfig(invalid_action="retry", max_retries=2))
    result = runner.run(specs("ToolUse-v0", ("lm",), 3))
    for t in result.trajectories:
        _check_token_exact(t)
        assert t.group_id == GroupKey("ToolUse-v0", t.role, "lm", seed=t.info["env_seed"])
    multi = [t for t in result.trajectories if len(t.turns) > 1]
    assert multi
    second = multi[0].turns[1]
    text = engine.tokenizer.decode(second.prompt_ids)
    assert "Invalid action" in text or "calc" in text


def test_memory_context_is_prompt_only_and_recorded(engine) -> None:
    marker = engine.tokenizer.encode("MEMORY: code 1234\n", add_special_tokens=False)

    def memory(requests):
        return [(marker, [f"rec-{r.episode_id[:4]}"]) for r in requests]

    runner = EpisodeRunner({"lm": LMPolicy(engine, templates=SHORT, memory=memory)})
    result = runner.run(specs("Recall-v0", ("lm",), 3))
    for t in result.trajectories:
        turn = t.turns[0]
        start = 1  # after bos
        assert turn.prompt_ids[start:start + len(marker)] == marker
        assert turn.memory_ids == [f"rec-{t.episode_id[:4]}"]
    batch = collate(result.trajectories, pad_id=engine.pad_id)
    assert batch.loss_mask[:, : 1 + len(marker)].sum().item() == 0


def test_context_overflow_ends_the_episode_as_truncated(engine) -> None:
    runner = EpisodeRunner({"lm": LMPolicy(engine, templates=SHORT, max_context=40),
                            "rand": RandomPolicy(0)})
    result = runner.run(specs("TicTacToe-v0", ("lm", "rand"), 4))
    assert all(r.ended_by == "context" and set(r.results.values()) == {"draw"}
               for r in result.episodes)
    assert result.metrics["match/truncated_rate"] == 1.0


def test_prompt_template_per_env(engine) -> None:
    policy = LMPolicy(engine, templates={"KuhnPoker-v0": PromptTemplate(first="KUHN {agent}:"),
                                         "*": SHORT})
    runner = EpisodeRunner({"lm": policy, "rand": RandomPolicy(0)},
                           RunnerConfig(random_seats=False))
    kuhn = runner.run(specs("KuhnPoker-v0", ("lm", "rand"), 1)).trajectories[0]
    assert engine.tokenizer.decode(kuhn.turns[0].prompt_ids[1:]) == "KUHN player_0:"
    ttt = runner.run(specs("TicTacToe-v0", ("lm", "rand"), 1)).trajectories[0]
    assert engine.tokenizer.decode(ttt.turns[0].prompt_ids[1:]).startswith("Tic-tac-toe.")


def test_bank_memory_puts_revealed_facts_into_later_prompts(engine, tmp_path) -> None:
    from agentrt.memory import open_bank

    bank = open_bank({"name": "recall"}, run_dir=tmp_path)
    facts: list[str] = []

    def remember(record) -> None:
        fact = record.final_infos["agent"]["revealed"]
        text = f"The code of '{fact['key']}' is {fact['value']}."
        facts.append(text)
        bank.write(text, policy_id="lm", env="Recall-v0", tags=["fact"])

    policy = LMPolicy(engine, templates=SHORT,
                      memory=bank_memory(bank, engine.tokenizer, "lm", k=2, token_budget=64))
    runner = EpisodeRunner({"lm": policy}, RunnerConfig(concurrency=1))
    result = runner.run(specs("Recall-v0", ("lm",), 4), on_episode_end=remember)
    first, *later = result.trajectories
    assert first.turns[0].memory_ids == []  # nothing stored before the first episode
    assert all(t.turns[0].memory_ids for t in later)
    prompt = engine.tokenizer.decode(later[-1].turns[0].prompt_ids)
    assert "Memories:" in prompt and any(f in prompt for f in facts)


def test_task_env_groups_repeated_prompts_for_group_baselines(engine) -> None:
    from agentrt.runner.core import EpisodeSpec

    runner = EpisodeRunner({"lm": LMPolicy(engine, templates=SHORT)})
    group = [EpisodeSpec("Task-v0", ("lm",), seed=7)] * 4 + [EpisodeSpec("Task-v0", ("lm",),
                                                                         seed=8)] * 4
    trajs = runner.run(group).trajectories
    assert len({t.group_id for t in trajs}) == 2
    for a, b in zip(trajs, trajs[1:4]):
        assert a.group_id == b.group_id and a.turns[0].prompt_ids == b.turns[0].prompt_ids
    assert all(t.outcome == t.reward for t in trajs)  # single agent: outcome is the return


def test_prompts_encoded_in_one_call_are_those_encoded_one_by_one(engine) -> None:
    policy = LMPolicy(engine, templates=SHORT)
    texts = ["X|X1O3X5678\nAction: ", "", "  two  spaces", "ünïcode ✓\n", "a+b="]
    assert policy.encode_many(texts) == [policy.encode(t) for t in texts]
    assert policy.encode_many([]) == []
    calls = []
    tokenizer = policy.tokenizer

    class Counting:  # the real tokenizer, its calls counted
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def __call__(self, *args, **kwargs):
            calls.append(len(args[0]))
            return tokenizer(*args, **kwargs)

    policy.tokenizer = Counting()
    assert policy.encode_many(texts) == [policy.encode(t) for t in texts]
    assert calls == [len(texts)]  # one batched call
