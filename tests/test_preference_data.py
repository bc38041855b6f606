"""Preference data: the three row shapes from JSONL, Parquet and saved datasets, token-exact
batches, malformed rows counted and skipped, config validation, and pairs built from rollouts
and from tournament matches."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from agentrt.config.load import load_config, validate_config
from agentrt.config.sections import PolicyConfig
from agentrt.workloads.prompts.config import DataConfig
from agentrt.core.errors import ConfigError
from agentrt.policies.models import load_model
from agentrt.runtime.preference import best_worst_pairs, make_batch, tournament_pairs
from agentrt.workloads.prompts.preference_data import load_preference_data, parse_row, read_rows
from agentrt.core.types import Trajectory, Turn
from agentrt.workloads.prompts.config import TrainConfig

AGENTRT = [sys.executable, "-m", "agentrt.cli"]
ROWS = [
    {"prompt": "1+2=", "chosen": "3", "rejected": "4"},
    {"prompt": "5+5=", "responses": ["11", "10", "9"], "scores": [0.5, 1.0, 0.5]},
    {"prompt": "7+1=", "responses": ["8", "9"]},
    {"prompt": "2+2=", "response": "4", "desirable": True},
]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and do not fight other processes for cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_model(tiny_model_dir)[1]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_row_shapes_and_ranks():
    assert parse_row(ROWS[0]) == ("1+2=", ["3", "4"], [0, 1], None)
    # scores: higher is better, equal scores tie
    assert parse_row(ROWS[1]) == ("5+5=", ["11", "10", "9"], [1, 0, 1], None)
    assert parse_row(ROWS[2]) == ("7+1=", ["8", "9"], [0, 1], None)  # no ranks: best first
    assert parse_row(ROWS[3]) == ("2+2=", ["4"], [0], [1.0])
    assert parse_row({"prompt": "x", "responses": ["a", "b"], "ranks": [2, 0]})[2] == [1, 0]


def test_jsonl_parquet_and_saved_datasets_read_the_same(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    pairs = [ROWS[0], {"prompt": "3+4=", "chosen": "7", "rejected": "8"}]
    jsonl = write_jsonl(tmp_path / "d.jsonl", pairs)
    pq.write_table(pa.Table.from_pylist(pairs), tmp_path / "d.parquet")
    datasets.Dataset.from_list(pairs).save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(pairs[:1]),
                          "test": datasets.Dataset.from_list(pairs[1:])}
                         ).save_to_disk(str(tmp_path / "dd"))
    for path in (jsonl, tmp_path / "d.parquet", tmp_path / "ds"):
        assert read_rows(DataConfig(path=str(path))) == pairs, path
    assert read_rows(DataConfig(path=str(tmp_path / "dd"))) == pairs[:1]
    assert read_rows(DataConfig(path=str(tmp_path / "dd"), split="test")) == pairs[1:]


def test_tokenized_once_token_exact_prompt_masked(tmp_path, tok):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    train, held = load_preference_data(DataConfig(path=str(path), eval_fraction=0.0), tok,
                                       accepts_unpaired=True)
    assert held == [] and [ex.prompt for ex in train] == [r["prompt"] for r in ROWS]
    bos, eos = tok.bos_token_id, tok.eos_token_id
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    ex = train[1]
    assert ex.prompts == [[bos] + enc("5+5=")] * 3
    assert ex.responses == [enc("11") + [eos], enc("10") + [eos], enc("9") + [eos]]
    batch = make_batch(train, tok.pad_token_id)
    assert batch.size == 4 and batch.seqs.size == 2 + 3 + 2 + 1
    for n, (p, r) in enumerate([(p, r) for e in train for p, r in zip(e.prompts, e.responses)]):
        ids = batch.seqs.input_ids[n]
        assert ids[:len(p) + len(r)].tolist() == p + r
        assert (ids[len(p) + len(r):] == tok.pad_token_id).all()
        mask = batch.seqs.loss_mask[n]
        assert mask[:len(p)].sum() == 0 and mask[len(p):len(p) + len(r)].sum() == len(r)
        assert mask[len(p) + len(r):].sum() == 0  # padding carries no loss
    assert batch.index.desirable.tolist() == [1, 0, 0, 1, 0, 1, 0, 1]
    assert batch.loss_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]]
    sub = batch.select(slice(1, 3))  # micro-batches take whole examples
    assert sub.seqs.size == 5 and sorted(sub.index.pairs.tolist()) == [[1, 0], [1, 2], [3, 4]]


def test_malformed_rows_counted_and_skipped_in_one_line(tmp_path, tok, caplog):
    bad = [
        {"prompt": "1+1=", "chosen": "2"},  # missing field
        {"chosen": "2", "rejected": "3"},  # missing field
        {"prompt": "1+1=", "chosen": "  ", "rejected": "3"},  # empty chosen
        {"prompt": "1+1=", "chosen": "2", "rejected": "2"},  # chosen == rejected
        {"prompt": "1+1=" * 40, "chosen": "2", "rejected": "3"},  # over-long
        "{not json",
        {"prompt": "1+1=", "responses": ["2", "3"], "scores": [1, 1]},  # all tie
        {"prompt": "1+1=", "responses": ["2", "3"], "ranks": [0]},  # ranks do not match
        {"prompt": "1+1=", "response": "2", "desirable": True},  # unpaired, needs kto
    ]
    path = write_jsonl(tmp_path / "d.jsonl", ROWS[:1] + bad)
    with caplog.at_level(logging.INFO, logger="agentrt.runtime.preference"):
        train, _ = load_preference_data(DataConfig(path=str(path), max_length=64,
                                                   eval_fraction=0.0), tok, False)
    assert len(train) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    line = warnings[0]
    assert "skipped 9 of 10 rows" in line
    for part in ("missing field: 2", "empty response: 1", "chosen == rejected: 1",
                 "too long: 1", "not a JSON object: 1", "all responses tie: 1",
                 "ranks/scores do not match responses: 1", "unpaired row (needs algorithm kto): 1"):
        assert part in line, part


def test_eval_split_is_by_prompt_and_task_prompts_are_dropped(tmp_path, tok):
    rows = [{"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i)} for i in range(200)]
    rows += [{"prompt": "0+1=", "chosen": "1", "rejected": "2"}]  # same prompt twice
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    train, held = load_preference_data(DataConfig(path=str(path), eval_fraction=0.2), tok,
                                       False, exclude_prompts={"5+1=", "6+1="})
    tr, he = {e.prompt for e in train}, {e.prompt for e in held}
    assert not tr & he and 20 < len(he) < 60
    assert len(train) + len(held) == 199 and not {"5+1=", "6+1="} & (tr | he)


def test_ppo_and_dpo_configs_differ_only_in_the_algorithm_name(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", ROWS[:1])
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({
        "run_dir": str(tmp_path / "run"), "data": {"path": str(data)},
        "policy": {"optim": {"lr": 3e-4}, "micro_batch_size": 8,
                   "algorithm": {"name": "ppo", "beta": 0.2}}}))
    ppo = load_config(path, None, TrainConfig)
    dpo = load_config(path, ["policy.algorithm.name=dpo"], TrainConfig)
    assert ppo.model_dump(exclude={"policy"}) == dpo.model_dump(exclude={"policy"})
    assert ppo.policy.model_dump(exclude={"algorithm"}) == dpo.policy.model_dump(
        exclude={"algorithm"})
    a, b = ppo.policy.algorithm.model_dump(), dpo.policy.algorithm.model_dump()
    changed = {k for k in a if a[k] != b[k]}
    # the name, and what its preset sets: PPO's estimator and critic, DPO's loss
    assert changed == {"name", "advantage", "critic", "preference_loss"}
    assert not ppo.policy.algorithm.is_preference and dpo.policy.algorithm.is_preference
    assert dpo.policy.algorithm.beta == 0.2


@pytest.mark.parametrize("patch, expected", [
    ({"policy": {"algorithm": "dpo"}}, "algorithm dpo needs data.path"),
    ({"policy": {"algorithm": {"name": "kto", "beta": 0}}},
     "policy.algorithm.beta: Input should be greater than 0"),
    ({"policy": {"algorithm": {"name": "dpo", "preference_loss": "orpo"}}},
     "preference_loss 'orpo' is not registered; valid: dpo, ipo, kto, listwise"),
    ({"policy": {"algorithm": {"name": "dpo", "online": True}}, "data": {"path": "nope.jsonl"}},
     "data.path 'nope.jsonl' does not exist"),
    ({"data": {"pairs": "some"}}, "data.pairs: Input should be 'all' or 'best_worst'"),
])
def test_preference_config_errors_are_one_line(tmp_path, patch, expected):
    with pytest.raises(ConfigError) as err:
        validate_config({"run_dir": str(tmp_path / "run"), **patch}, TrainConfig)
    assert str(err.value).startswith("invalid config") and expected in str(err.value)
    assert "\n" not in str(err.value)


def test_cli_says_what_a_dpo_run_lacks_in_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"),
                                    "policy": {"algorithm": "dpo"}}))
    proc = subprocess.run(AGENTRT + ["train", str(path)], capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "algorithm dpo needs data.path" in lines[0] and "online: true" in lines[0]
    assert not (tmp_path / "run").exists()


def test_online_dpo_is_a_policy_algorithm_with_a_reference():
    cfg = PolicyConfig(algorithm={"name": "dpo", "online": True})
    assert cfg.algorithm.is_preference and cfg.algorithm.online


def turn(prompt, response, reward=0.0, policy="p", role="agent"):
    return Turn(prompt, response, [-0.5] * len(response), reward=reward, policy_id=policy,
                role=role)


def test_best_worst_pairs_from_rollouts_skip_ties():
    trajs = [Trajectory([turn([1, 5], [7, 2], r)], group_id="g0") for r in (0.5, 1.0, 0.0, 1.0)]
    trajs += [Trajectory([turn([1, 6], [8, 2], 1.0)], group_id="g1") for _ in range(3)]
    trajs[1].turns[0].response_ids = [9, 9, 2]
    trajs[1].turns[0].logprobs = [0.0] * 3
    pairs = best_worst_pairs(trajs)
    assert len(pairs) == 1  # g1 ties everywhere
    (ex,) = pairs
    assert ex.prompts == [[1, 5], [1, 5]] and ex.responses == [[9, 9, 2], [7, 2]]
    assert ex.ranks == [0, 1]


def test_tournament_pairs_take_matched_turns_of_winner_and_loser():
    w = Trajectory([turn([1, 10], [20, 2], policy="a", role="player_0"),
                    turn([1, 10, 20, 2, 30], [21, 2], policy="a", role="player_0"),
                    turn([1, 10, 20, 2, 30, 21, 2, 31], [22, 2], policy="a", role="player_0")],
                   episode_id="m1", role="player_0", policy_id="a", outcome=1.0)
    lo = Trajectory([turn([1, 11, 20, 2], [30, 2], policy="b", role="player_1"),
                     turn([1, 11, 20, 2, 30, 2, 21, 2], [31, 2], policy="b", role="player_1")],
                    episode_id="m1", role="player_1", policy_id="b", outcome=-1.0)
    draw = [Trajectory([turn([1], [5, 2])], episode_id="m2", outcome=0.0),
            Trajectory([turn([1], [6, 2])], episode_id="m2", outcome=0.0)]
    unfinished = [Trajectory([turn([1], [5, 2])], episode_id="m3")]
    pairs = tournament_pairs([lo, *draw, w, *unfinished])
    assert len(pairs) == 2  # the loser has 2 turns; the draw and the unfinished give none
    for k, ex in enumerate(pairs):
        assert ex.prompts == [w.turns[k].prompt_ids, lo.turns[k].prompt_ids]
        assert ex.responses == [w.turns[k].response_ids, lo.turns[k].response_ids]
        assert ex.ranks == [0, 1]
    assert len(tournament_pairs([w, lo], policy_id="b")) == 2
    assert tournament_pairs([w, lo], policy_id="c") == []
    assert tournament_pairs([w, lo], same_prompt=True) == []
    mirror = Trajectory([turn(list(t.prompt_ids), [40, 2]) for t in w.turns[:1]],
                        episode_id="m1", outcome=-1.0)
    (ex,) = tournament_pairs([w, mirror], same_prompt=True)
    assert ex.responses == [[20, 2], [40, 2]]


def test_tournament_pairs_train_an_online_dpo_policy(tiny_model_dir):
    from agentrt.runtime.worker import PolicyWorker

    cfg = PolicyConfig(model={"path": str(tiny_model_dir)}, optim={"lr": 1e-3},
                       algorithm={"name": "dpo", "online": True, "beta": 0.5})
    worker = PolicyWorker([cfg], seed=0)  # what a pool's preference_step calls
    eng = worker.learners[cfg.id]
    assert eng.reference.needed and eng.reference.name is not None
    w = Trajectory([turn([1, 10], [20, 2]), turn([1, 10, 20, 2, 30], [21, 2])],
                   episode_id="m", outcome=1.0)
    lo = Trajectory([turn([1, 11], [25, 2]), turn([1, 11, 25, 2, 31], [26, 2])],
                    episode_id="m", outcome=0.0)
    pairs = tournament_pairs([w, lo])
    before = [p.detach().clone() for p in eng.model.parameters()]
    first = worker.preference_step(pairs)
    assert first["actor/loss"] == pytest.approx(torch.log(torch.tensor(2.0)).item(), abs=1e-5)
    assert first["pref/accuracy"] == pytest.approx(0.5)  # policy == reference: a tie
    assert all(p.ref_logps is not None for p in pairs)
    for _ in range(5):
        last = worker.preference_step(pairs)
    assert last["pref/margin"] > 0 and last["pref/accuracy"] == 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, eng.model.parameters()))
    assert eng.version == 6
