"""Single-policy runs end to end: learning signal per algorithm, resume, bad input, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrt.config.load import validate_config
from agentrt.core.errors import ConfigError
from agentrt.rewards import reward
from agentrt.workloads.prompts.workload import Trainer
from agentrt.workloads.prompts.config import TrainConfig

AGENTRT = [sys.executable, "-m", "agentrt.cli"]


@reward("test_digit_fraction")
def digit_fraction(prompt: str, response: str, info: dict) -> float:
    """Dense, easy signal: share of response characters that are digits."""
    return sum(c.isdigit() for c in response) / max(1, len(response))


@reward("test_flaky")
def flaky(prompt: str, response: str, info: dict) -> float:
    if len(response) % 2:
        raise RuntimeError("user reward bug")
    return 1.0


def small_config(run_dir: Path, model_dir: Path, **over) -> dict:
    cfg = {
        "seed": 0, "run_dir": str(run_dir), "progress": False,
        "task": {"name": "arithmetic", "train_size": 500, "eval_size": 16},
        "reward": "test_digit_fraction",
        "policy": {"model": {"path": str(model_dir)}, "optim": {"lr": 1e-3},
                   "rollout": {"sampling": {"max_new_tokens": 4}}},
        "train": {"steps": 12, "prompts_per_step": 8, "group_size": 4},
        "eval": {"every": 100}, "checkpoint": {"every": 100},
    }
    for key, value in over.items():
        node = cfg
        *path, last = key.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = value
    return cfg


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "reinforce++", "ppo"])
def test_reward_goes_up(tmp_path, tiny_model_dir, algorithm):
    # lr 3e-3: at 1e-3 GRPO gained only +0.06 in 12 steps on this machine's torch/transformers
    # (0.064 -> 0.126, the same at 8857db1); at 3e-3: grpo 0.075 -> 0.516, rloo 0.075 -> 0.506,
    # reinforce++ 0.069 -> 0.462.
    extra = {"policy.algorithm": {"name": algorithm, "critic_lr": 1e-3}, "policy.optim.lr": 3e-3}
    cfg = validate_config(small_config(tmp_path, tiny_model_dir, **extra), TrainConfig)
    Trainer(cfg).run()
    r = [row["reward/mean"] for row in rows(tmp_path) if "reward/mean" in row]
    assert len(r) == 12
    start, end = sum(r[:3]) / 3, sum(r[-3:]) / 3
    assert end > start + 0.1, f"{algorithm}: reward {start:.3f} -> {end:.3f}"
    assert (tmp_path / "curves.png").is_file() and (tmp_path / "config.yaml").is_file()
    assert (tmp_path / "final_model" / "config.json").is_file()


def test_resume_gives_the_same_next_steps(tmp_path, tiny_model_dir):
    def cfg(d):
        return validate_config(small_config(d, tiny_model_dir, **{
            "train.steps": 5, "checkpoint.every": 2, "sft.steps": 3, "sft.batch_size": 8,
            "policy.algorithm": {"name": "grpo", "kl": {"coef": 0.01}},
            "policy.optim.schedule": "cosine"}), TrainConfig)

    Trainer(cfg(tmp_path / "a")).run()
    Trainer(cfg(tmp_path / "b")).run(stop_after=3)  # as if killed after step 3 (ckpt at 2)
    Trainer(cfg(tmp_path / "b")).run()
    a, b = rows(tmp_path / "a"), rows(tmp_path / "b")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 3, 4, 5]
    for ra, rb in zip(a[3:], b[3:]):
        for key in ("actor/loss", "actor/pg_loss", "actor/grad_norm", "actor/kl",
                    "actor/entropy", "reward/mean"):
            assert rb[key] == pytest.approx(ra[key], abs=1e-6), (ra["step"], key)


def test_reward_exceptions_are_counted_and_the_run_goes_on(tmp_path, tiny_model_dir):
    cfg = validate_config(small_config(tmp_path, tiny_model_dir, reward="test_flaky",
                                       **{"train.steps": 2}), TrainConfig)
    Trainer(cfg).run()
    errors = [r["reward/errors"] for r in rows(tmp_path) if "reward/errors" in r]
    assert len(errors) == 2 and all(0 < e < 32 for e in errors)


@pytest.mark.parametrize("patch, expected", [
    ({"policy": {"optim": {"lr": -1}}}, "policy.optim.lr: Input should be greater than 0"),
    ({"policy": {"algorithm": "sac"}}, "policy.algorithm.name: Input should be 'grpo', 'ppo'"),
    ({"policy": {"algorithm": {"name": "grpo", "advantage": "nope"}}},
     "is not registered; valid: gae, grpo"),
    ({"train": {"stepz": 3}}, "train.stepz: Extra inputs are not permitted"),
    ({"task": {"options": {"digits": 0}}}, "task: options: digits: Input should be greater"),
    ({"policy": {"model": {"preset": "llama-huge"}}}, "unknown preset 'llama-huge'"),
])
def test_invalid_config_is_one_message_naming_the_field(tmp_path, patch, expected):
    run_dir = tmp_path / "run"
    cfg = {"run_dir": str(run_dir), **patch}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match="invalid config"):
        validate_config(cfg, TrainConfig)
    proc = subprocess.run(AGENTRT + ["train", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert not run_dir.exists()  # nothing started


def test_missing_model_folder_is_a_one_line_cli_error(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"),
                                    "policy": {"model": {"path": str(tmp_path / "missing")}}}))
    proc = subprocess.run(AGENTRT + ["train", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: policy.model.path: folder")
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_reward_by_import_path_and_unknown_reward(tmp_path):
    from agentrt.rewards import resolve_reward

    assert resolve_reward("agentrt.rewards:exact_match")("", " 4 ", {"answer": "4"}) == 1.0
    with pytest.raises(ConfigError, match="valid: .*exact_match"):
        resolve_reward("nope")
    with pytest.raises(ConfigError, match="has no function"):
        resolve_reward("agentrt.rewards:nope")


def test_demonstrations_are_bos_prompt_then_answer_and_eos(tiny_model_dir):
    from transformers import AutoTokenizer

    from agentrt.envs.tasks import Example, encode_prompt
    from agentrt.workloads.prompts.workload import demonstrations

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    exs = [Example("12+7=", "19"), Example("", "5"), Example("3+4=", "")]
    trajs = demonstrations(tok, exs)
    for ex, traj in zip(exs, trajs):
        (turn,) = traj.turns
        assert turn.prompt_ids == encode_prompt(tok, ex.prompt)
        answer = tok.encode(ex.answer, add_special_tokens=False)
        assert turn.response_ids == answer + [tok.eos_token_id]
        assert turn.logprobs == [0.0] * len(turn.response_ids)
    assert demonstrations(tok, []) == []


def test_demonstrations_from_the_cache_are_those_encoded_afresh(tiny_model_dir):
    from transformers import AutoTokenizer

    from agentrt.envs.tasks import Example
    from agentrt.workloads.prompts.workload import demonstrations

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cache: dict[str, list[int]] = {}
    first = [Example("12+7=", "19"), Example("3+4=", "7"), Example("12+7=", "19")]
    again = [Example("3+4=", "7"), Example("40+2=", "42")]
    for exs in (first, again, first):
        fresh = demonstrations(tok, exs)
        cached = demonstrations(tok, exs, cache)
        assert [t.turns[0].prompt_ids for t in cached] == [t.turns[0].prompt_ids for t in fresh]
        assert [t.turns[0].response_ids for t in cached] == [
            t.turns[0].response_ids for t in fresh]
    assert set(cache) == {"12+7=", "19", "3+4=", "7", "40+2=", "42"}
    cached[0].turns[0].prompt_ids.append(0)  # a batch's lists are its own, not the cache's
    assert cache["12+7="] == tok.encode("12+7=", add_special_tokens=False)


def test_the_demonstration_cache_starts_over_when_full(tiny_model_dir, monkeypatch):
    from transformers import AutoTokenizer

    from agentrt.workloads.prompts import workload
    from agentrt.envs.tasks import Example

    monkeypatch.setattr(workload, "DEMO_CACHE_TEXTS", 4)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cache: dict[str, list[int]] = {}
    workload.demonstrations(tok, [Example("1+1=", "2"), Example("2+2=", "4")], cache)
    assert len(cache) == 4
    (traj,) = workload.demonstrations(tok, [Example("3+3=", "6")], cache)
    assert set(cache) == {"3+3=", "6"}  # the batch's texts only, a stream never grows it past 4
    assert traj.turns[0].response_ids == tok.encode("6", add_special_tokens=False) + [
        tok.eos_token_id]


def test_repeated_texts_are_encoded_once_each_into_lists_of_their_own(tiny_model_dir):
    from transformers import AutoTokenizer

    from agentrt.envs.tasks import encode_texts

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    calls = []
    encode = type(tok).__call__

    def counting(self, texts, **kw):
        calls.append(list(texts))
        return encode(self, texts, **kw)

    texts = ["12+7=", "3+4=", "12+7=", "", "3+4=", "12+7="]
    type(tok).__call__ = counting
    try:
        out = encode_texts(tok, texts)
    finally:
        type(tok).__call__ = encode
    assert calls == [["12+7=", "3+4=", ""]]
    assert out == [tok.encode(t, add_special_tokens=False) for t in texts]
    out[0].append(-1)  # a caller extends one prompt's ids: its twins keep theirs
    assert out[2] == out[5] == tok.encode("12+7=", add_special_tokens=False)


def test_texts_encode_as_transformers_encodes_them(tiny_model_dir):
    """The Rust tokenizer's ids are the call's (special-token text, non-ASCII, blanks); padding
    set on the Rust side or special tokens split keep transformers' call, with its ids."""
    from transformers import AutoTokenizer

    from agentrt.envs.tasks import encode_texts, rust_encoder

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = ["12+7=", " spaced  out ", "é漢字🙂", "", f"{tok.eos_token}x{tok.bos_token}", "\n\t"]

    def called():
        return [list(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]

    assert rust_encoder(tok) is tok.backend_tokenizer
    assert encode_texts(tok, texts) == called()
    assert tok.eos_token_id in encode_texts(tok, texts)[4]  # special tokens in text: as the call
    tok.backend_tokenizer.enable_padding(length=16, pad_id=tok.pad_token_id)
    assert rust_encoder(tok) is None
    assert encode_texts(tok, texts) == called()  # the call turned the padding off again
    assert rust_encoder(tok) is tok.backend_tokenizer
    tok.split_special_tokens = True
    assert rust_encoder(tok) is None
    assert encode_texts(tok, texts) == called()
    assert tok.eos_token_id not in encode_texts(tok, texts)[4]


def test_texts_decode_as_transformers_decodes_them(tiny_model_dir):
    """The one-call decode gives batch_decode's texts (special tokens left out, bytes that are
    not UTF-8 on their own too); a tokenizer that cleans up spaces keeps transformers' decode."""
    from transformers import AutoTokenizer

    from agentrt.envs.tasks import decode_texts

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = [tok.bos_token_id, *tok.encode("12 + 7 = 19 ,ok", add_special_tokens=False)]
    seqs = [text, [], [tok.eos_token_id], text[:3] + [tok.eos_token_id, *text[3:]],
            list(range(1, tok.vocab_size))]
    assert decode_texts(tok, seqs) == tok.batch_decode(seqs, skip_special_tokens=True)
    assert decode_texts(tok, [tuple(text)]) == tok.batch_decode([text], skip_special_tokens=True)
    calls = []
    batch_decode = type(tok).batch_decode

    def counting(self, seqs, **kw):
        calls.append(len(seqs))
        return batch_decode(self, seqs, **kw)

    type(tok).batch_decode = counting
    try:
        assert decode_texts(tok, seqs) == tok.batch_decode(seqs, skip_special_tokens=True)
        assert calls == [len(seqs)]  # the fast path: the Rust tokenizer only
        tok.clean_up_tokenization_spaces = True
        assert decode_texts(tok, seqs) == tok.batch_decode(seqs, skip_special_tokens=True)
        assert calls == [len(seqs), len(seqs), len(seqs)]
    finally:
        type(tok).batch_decode = batch_decode
