"""Prompt data sets from files (agentrt.workloads.prompts.data): JSONL, Parquet and saved datasets streamed with a
column mapping, a disjoint eval split, skipped rows counted, chat prompts rendered, and a resume
that continues at the exact row, through real training runs of the nano model."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentrt.config.load import validate_config
from agentrt.workloads.prompts.config import TaskConfig
from agentrt.workloads.prompts.data import check_source, open_source
from agentrt.workloads.prompts.data.readers import JsonlReader, open_reader
from agentrt.workloads.prompts.data.sources import keyword_reward, render_messages
from agentrt.config.sections import PolicyConfig
from agentrt.core.errors import ConfigError
from agentrt.policies.chat import policy_chat
from agentrt.workloads.prompts.workload import Trainer
from agentrt.workloads.prompts.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
N = 300
MAPPING = {"prompt": "q", "answer": "a", "extra": ["tol", "meta"]}


def make_rows(n: int = N) -> list[dict[str, Any]]:
    return [{"q": f"{i}+{i % 7}=", "a": i + i % 7, "tol": i % 3,
             "meta": {"k": [i, i + 1], "s": "x"}, "unused": "z" * 10} for i in range(n)]


def write(fmt: str, folder: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` as a JSONL file, a Parquet file of several row groups or a datasets folder."""
    if fmt == "jsonl":
        path = folder / "p.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "parquet":
        path = folder / "p.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=64)
    else:
        import datasets

        path = folder / "ds"
        datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(path))
    return path


def task(path: Path | str, eval_size: int = 20, **options: Any) -> TaskConfig:
    return TaskConfig(name="dataset", eval_size=eval_size,
                      options={"path": str(path), "columns": MAPPING, **options})


def prompts_parquet(folder: Path, rows: int = 200) -> Path:
    """A small file of examples/grpo_parquet.yaml's kind (examples/make_prompts_parquet.py)."""
    from make_prompts_parquet import write as write_parquet

    return write_parquet(folder / "prompts.parquet", rows, row_group=50)


def prompts(examples: list[Any]) -> list[str]:
    return [ex.prompt for ex in examples]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "datasets"])
def test_round_trip_every_row_once_per_epoch_eval_disjoint(fmt: str, tmp_path: Path) -> None:
    rows = make_rows()
    source = open_source(task(write(fmt, tmp_path, rows), shuffle_buffer=50), seed=3)
    source.start(None)
    held = source.eval_examples()
    assert prompts(held) == [r["q"] for r in rows[:20]]  # default: the first eval_size rows
    epoch = source.next(N - 20)
    assert sorted(prompts(epoch)) == sorted(r["q"] for r in rows[20:])  # each once, none held
    assert prompts(epoch) != [r["q"] for r in rows[20:]]  # shuffled
    by_prompt = {r["q"]: r for r in rows}
    for ex in epoch[:5]:
        row = by_prompt[ex.prompt]
        assert ex.answer == str(row["a"])
        assert ex.info == {"answer": str(row["a"]), "tol": row["tol"], "meta": row["meta"]}
    second = source.next(N - 20)
    assert sorted(prompts(second)) == sorted(prompts(epoch)) and second != epoch
    assert source.metrics()["data/epoch"] == 1.0 and source.metrics()["data/skipped_rows"] == 0


def test_formats_give_the_same_stream(tmp_path: Path) -> None:
    """JSONL in small byte blocks, Parquet row groups and datasets ranges: one stream each,
    the same rows; the block order and the buffer depend on the layout, the set does not."""
    rows = make_rows()
    streams = []
    for fmt in ("jsonl", "parquet", "datasets"):
        (tmp_path / fmt).mkdir()
        source = open_source(task(write(fmt, tmp_path / fmt, rows), shuffle_buffer=0), seed=0)
        streams.append(prompts(source.next(N - 20)))
    assert streams[0] == streams[1] == streams[2] == [r["q"] for r in rows[20:]]  # file order


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "datasets"])
def test_resume_mid_block_continues_with_the_same_rows(fmt: str, tmp_path: Path, monkeypatch
                                                        ) -> None:
    monkeypatch.setattr("agentrt.workloads.prompts.data.readers.JSONL_BLOCK_BYTES", 700)  # many JSONL blocks
    monkeypatch.setattr("agentrt.workloads.prompts.data.readers.DATASETS_BLOCK_ROWS", 40)
    cfg = task(write(fmt, tmp_path, make_rows()), shuffle_buffer=16)
    first = open_source(cfg, seed=1)
    assert first.stream.reader.num_blocks > 4
    for taken in (7, 111, 280 - 7 - 111 + 5):  # into the next epoch too
        first.next(taken)
        state = json.loads(json.dumps(first.state_dict()))  # plain data, as checkpointed
        again = open_source(cfg, seed=1)
        again.load_state_dict(state)
        assert prompts(again.next(60)) == prompts(first.next(60))


def test_eval_split_by_fraction_and_by_file(tmp_path: Path) -> None:
    rows = make_rows()
    path = write("parquet", tmp_path, rows)
    source = open_source(task(path, eval_size=5, eval={"fraction": 0.2}), seed=0)
    held = prompts(source.eval_examples())
    trained = set(prompts(source.next(N)))
    assert len(held) == 5 and not set(held) & trained
    assert 0.7 * N < len(trained) < 0.9 * N  # about 20% of the prompts never trained on
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps(r) + "\n" for r in rows[100:110]))
    source = open_source(task(path, eval_size=10, eval={"path": str(eval_file)}), seed=0)
    assert prompts(source.eval_examples()) == [r["q"] for r in rows[100:110]]
    assert set(prompts(source.next(N - 10))) == {r["q"] for r in rows} - {
        r["q"] for r in rows[100:110]}


def test_bad_rows_are_skipped_counted_and_warned_once(tmp_path: Path, caplog) -> None:
    rows: list[Any] = make_rows(60)
    bad = ["not json", json.dumps({"q": 5, "a": 1, "tol": 0, "meta": {}}),  # prompt not text
           json.dumps({"q": "x=", "a": None, "tol": 0, "meta": {}}),  # missing answer
           json.dumps({"q": "y=", "a": [1], "tol": 0, "meta": {}}),  # answer a list
           json.dumps({"q": "z=", "a": 1, "meta": {}}),  # no tol
           json.dumps([1, 2]), ""]  # an array, a blank line (not a row)
    lines = [json.dumps(r) for r in rows]
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines[:30] + bad + lines[30:]) + "\n")
    source = open_source(task(path, eval_size=4), seed=0)
    with caplog.at_level(logging.WARNING, logger="agentrt.workloads.prompts.data"):
        got = source.next(56 * 2)
    assert sorted(prompts(got)) == sorted([r["q"] for r in rows[4:]] * 2)
    assert source.metrics()["data/skipped_rows"] == 6 * 2  # both epochs
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "skipped a row" in warned[0] and "data/skipped_rows" in warned[0]


def test_no_usable_row_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"q": "1=", "a": 1, "tol": 0, "meta": {}}) + "\n"
                    + json.dumps({"q": 2, "a": 1, "tol": 0, "meta": {}}) + "\n")
    source = open_source(task(path, eval_size=1), seed=0)  # the one good row is held out
    with pytest.raises(Exception, match="has no usable training rows") as err:
        source.next(1)
    assert type(err.value).__name__ == "PromptDataError"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "datasets"])
def test_a_missing_column_is_one_config_error_naming_the_field(fmt: str, tmp_path: Path
                                                               ) -> None:
    path = write(fmt, tmp_path, make_rows(10))
    cfg = TaskConfig(name="dataset", options={"path": str(path),
                                              "columns": {"prompt": "q", "answer": "target"}})
    with pytest.raises(ConfigError, match=r"task.options.columns.answer: column 'target' is "
                                          r"not in .*'q', 'a'"):
        check_source(cfg)


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    base = {"task": {"name": "dataset", "options": {"path": str(tmp_path)}}}
    cases = [({"path": str(tmp_path / "none.parquet")}, "path '"),
             ({"path": str(tmp_path), "format": "xml"}, "format"),
             ({"path": str(tmp_path), "columns": {"prompt": "a", "messages": "b"}}, "not both"),
             ({"path": str(tmp_path), "eval": {"fraction": 1.5}}, "fraction"),
             ({"path": str(tmp_path), "shuffle_buffer": -1}, "shuffle_buffer"), ({}, "path")]
    for options, expected in cases:
        with pytest.raises(ConfigError, match="task") as err:
            validate_config({**base, "task": {"name": "dataset", "options": options}}, TrainConfig)
        assert expected in str(err.value), (options, str(err.value))
    with pytest.raises(ConfigError, match="cannot be read as parquet"):
        bad = tmp_path / "x.parquet"
        bad.write_text("not parquet")
        open_reader(str(bad), "parquet")


def test_chat_messages_rendered_with_the_template_or_as_lines(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from agentrt.policies.models import build_model

    tokenizer = AutoTokenizer.from_pretrained(build_model(tmp_path / "m", "llama-nano", seed=0))
    def chat(i: int) -> list[dict[str, str]]:
        return [{"role": "system", "content": "Add."}, {"role": "user", "content": f"{i}+3="}]

    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"msgs": chat(i), "a": i + 3}) + "\n" for i in range(6))
                    + json.dumps({"msgs": "2+3=", "a": 1}) + "\n")  # not a chat: skipped
    cfg = TaskConfig(name="dataset", eval_size=1, options={
        "path": str(path), "columns": {"messages": "msgs", "answer": "a"}, "shuffle_buffer": 0})
    plain = open_source(cfg, seed=0)
    plain.start(tokenizer)  # no chat template: role lines
    assert plain.next(1)[0].prompt == "system: Add.\nuser: 1+3=\nassistant:"  # row 0: eval
    tokenizer.chat_template = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>"
                               "{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}"
                               "<|assistant|>{% endif %}")
    templated = open_source(cfg, seed=0)
    chat_cfg = policy_chat(PolicyConfig(), tokenizer)  # template: auto finds the tokenizer's
    templated.start(tokenizer, chat_cfg)
    expected = "<bos><|system|>Add.\n<|user|>1+3=\n<|assistant|>"
    assert templated.next(1)[0].prompt == expected == render_messages(chat_cfg, chat(1))
    assert templated.eval_examples()[0].prompt == render_messages(chat_cfg, chat(0))
    templated.next(10)
    assert templated.metrics()["data/skipped_rows"] >= 1


def test_keyword_reward_gets_the_columns() -> None:
    from prompt_rewards import closeness, within_tolerance

    info = {"answer": "10", "tolerance": 1, "difficulty": 2}
    assert within_tolerance("", "11", info) == 1.0 and within_tolerance("", "12", info) == 0.0
    assert closeness("", "11", info) == 1.0 and closeness("", "12", info) == pytest.approx(1 / 2)
    assert keyword_reward(lambda p, r, answer, **kw: float(r == answer))("", "10", info) == 1.0


def small_train(run_dir: Path, path: Path, **over: Any) -> Any:
    cfg = {"seed": 0, "run_dir": str(run_dir), "progress": False,
           "task": {"name": "dataset", "eval_size": 8,
                    "options": {"path": str(path), "shuffle_buffer": 32,
                                "columns": {"prompt": "question", "answer": "target",
                                            "extra": ["tolerance"]}}},
           "reward": "prompt_rewards:within_tolerance",
           "policy": {"model": {"preset": "llama-nano"}, "optim": {"lr": 1e-3},
                      "rollout": {"sampling": {"max_new_tokens": 3}}},
           "train": {"steps": 4, "prompts_per_step": 6, "group_size": 2},
           "eval": {"every": 100}, "checkpoint": {"every": 2}, **over}
    return validate_config(cfg, TrainConfig)


class Recorded:
    """Records what a run's prompt source hands out (the real source, wrapped)."""

    def __init__(self, trainer: Trainer) -> None:
        self.drawn: list[str] = []
        source = trainer.workload.source
        real = source.next

        def next_(n: int) -> list[Any]:
            out = real(n)
            self.drawn += prompts(out)
            return out

        source.next = next_


def test_training_resumes_at_the_exact_row(tmp_path: Path) -> None:
    """GRPO on a Parquet file with a reward reading an extra column: a run stopped after 3
    steps (checkpoint at 2) and resumed draws exactly the rows an uninterrupted run draws (the
    source alone, one draw of prompts_per_step per step, gives them)."""
    from make_prompts_parquet import write as write_parquet

    path = write_parquet(tmp_path / "p.parquet", 400, row_group=50, missing_every=40)
    first = Trainer(small_train(tmp_path / "b", path))
    seen_b1 = Recorded(first)
    first.run(stop_after=3)
    again = Trainer(small_train(tmp_path / "b", path))
    seen_b2 = Recorded(again)
    again.run()
    straight = open_source(small_train(tmp_path / "a", path).task, seed=0)
    expected = [ex.prompt for _ in range(4) for ex in straight.next(6)]
    assert len(seen_b1.drawn) == 3 * 6 and len(seen_b2.drawn) == 2 * 6
    assert seen_b1.drawn == expected[:18] and seen_b1.drawn[:12] + seen_b2.drawn == expected
    rows = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[-1]["data/skipped_rows"] == straight.metrics()["data/skipped_rows"] > 0
    assert rows[-1]["data/rows_read"] == straight.metrics()["data/rows_read"]
    assert all(r["reward/errors"] == 0 for r in rows[1:])  # info['tolerance'] always there
    held = {ex.prompt for ex in again.workload.eval_set}
    assert len(held) == 8 and not held & set(expected)


def test_jsonl_head_reads_only_what_it_needs(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(50)))
    assert [r["i"] for r in JsonlReader(path).head(3)] == [0, 1, 2]
