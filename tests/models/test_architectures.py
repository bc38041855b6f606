"""Every architecture runs every workload: a tiny random-weight checkpoint of each of
:data:`~agentrt.policies.presets.ARCHITECTURES` (Llama, Mistral, Qwen2, Qwen3, Gemma2, Gemma3,
Phi-3, GPT-2, GPT-NeoX), built into a folder and loaded by ``model: {path: ...}`` as a user's
checkpoint is, trains GRPO, PPO with a critic and DPO 2 steps, plays a 2-step league with LoRA
snapshots, trains as a decomposer's specialist 2 steps, and answers a request through the
serving API; packed rows give its padded log-probs.

Rollout takes whatever path the runtime picks for the architecture (the static decoder or
transformers' generate); these tests hold either way.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrt.config.load import validate_config
from agentrt.policies.models import build_model, build_tokenizer, load_model, lora_targets
from agentrt.policies.presets import ARCHITECTURES
from agentrt.rewards import reward
from agentrt.runtime.packing import Forward, layout, packed_attention
from agentrt.workloads.prompts.config import TrainConfig
from agentrt.workloads.prompts.workload import Trainer

CPU = torch.device("cpu")


@reward("arch_odd_bytes")
def odd_bytes(prompt: str, response: str, info: dict) -> float:
    """Varies between a group's responses from the first step (a random model's bytes), so
    every algorithm gets non-zero advantages: share of characters with an odd code point."""
    return sum(ord(c) % 2 for c in response) / max(1, len(response))


@pytest.fixture(autouse=True)
def one_thread():
    """Nano models run fastest on one thread (and leave the other core to the rest)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<arch>-nano`` saved in Hugging Face format (built once per architecture)."""
    return build_model(tmp_path_factory.mktemp("arch") / request.param,
                       f"{request.param}-nano", seed=0)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def changed(before: Path, after: Path) -> int:
    """How many tensors of the checkpoint in ``after`` differ from those in ``before``."""
    a, b = weights(before), weights(after)
    assert a.keys() == b.keys()
    return sum(not torch.equal(a[k], b[k]) for k in a)


def train_config(run_dir: Path, model_dir: Path, algorithm: dict, **extra) -> TrainConfig:
    cfg = {
        "seed": 0, "run_dir": str(run_dir), "progress": False, "threads": 1,
        "task": {"name": "arithmetic", "train_size": 64, "eval_size": 4,
                 "options": {"digits": 1}},
        "reward": "arch_odd_bytes",
        "policy": {"model": {"path": str(model_dir)}, "optim": {"lr": 1e-3},
                   "algorithm": algorithm, "rollout": {"sampling": {"max_new_tokens": 4}}},
        "train": {"steps": 2, "prompts_per_step": 2, "group_size": 4},
        "eval": {"every": 100}, "checkpoint": {"every": 100},
        **extra,
    }
    return validate_config(cfg, TrainConfig)


def test_packed_rows_give_the_padded_log_probs(arch_dir):
    """Sequence packing (on by default) is exact for the architecture: packed rows, position
    ids restarting at each sequence, give the padded batch's log-probs; the same rows with
    continuing position ids (attention leaking across sequences) do not, so the comparison
    can fail."""
    model, _ = load_model(arch_dir)
    model.eval()
    assert packed_attention(model, CPU, share_prefix=True) == (True, True)
    lengths = torch.tensor([9, 5, 7, 4, 8])
    mask = (torch.arange(9)[None] < lengths[:, None]).long()
    ids = torch.randint(3, 259, (5, 9), generator=torch.Generator().manual_seed(0)) * mask
    padded, packed = layout(ids, mask, False, 0), layout(ids, mask, True, 0)
    assert packed.input_ids.shape[0] < 5  # sequences really share rows
    leaky = packed.inputs(CPU)
    leaky["position_ids"] = torch.arange(leaky["input_ids"].shape[1]).expand_as(leaky["input_ids"])
    with torch.no_grad():
        want = Forward(model(**padded.inputs(CPU)).logits.float(), padded).logprobs() * mask
        got = Forward(model(**packed.inputs(CPU)).logits.float(), packed).logprobs() * mask
        leak = Forward(model(**leaky).logits.float(), packed).logprobs() * mask
    assert float((got - want).abs().max()) < 1e-5
    assert float((leak - want).abs().max()) > 0.05


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_rl_trains_two_steps(tmp_path, arch_dir, algorithm):
    Trainer(train_config(tmp_path, arch_dir, {"name": algorithm})).run()
    log = [r for r in rows(tmp_path) if "actor/loss" in r]
    assert [r["step"] for r in log] == [1, 2]
    for r in log:
        assert math.isfinite(r["actor/loss"]) and math.isfinite(r["actor/grad_norm"])
        assert r["actor/grad_norm"] > 0
        if algorithm == "ppo":  # the critic trains beside the policy
            assert math.isfinite(r["critic/loss"]) and r["critic/loss"] > 0
    assert changed(arch_dir, tmp_path / "final_model") > 0


def test_dpo_trains_two_steps(tmp_path, arch_dir):
    pairs = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)}
             for a in range(4) for b in range(3)]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    Trainer(train_config(tmp_path / "run", arch_dir, {"name": "dpo", "beta": 0.1},
                         data={"path": str(data), "max_length": 32,
                               "eval_fraction": 0.25})).run()
    log = [r for r in rows(tmp_path / "run") if "actor/loss" in r]
    assert [r["step"] for r in log] == [1, 2]
    assert all(math.isfinite(r["actor/loss"]) and math.isfinite(r["pref/margin"]) for r in log)
    assert changed(arch_dir, tmp_path / "run" / "final_model") > 0


def test_league_with_lora_snapshots(tmp_path, arch_dir):
    """Two league steps of a LoRA policy whose adapters sit on the architecture's own layers
    (the default targets); a snapshot is frozen every step and plays in the next."""
    from agentrt.controller.checkpoint import load_checkpoint
    from agentrt.controller.run_dir import RunDir
    from agentrt.tournaments.records import MatchStore
    from agentrt.tournaments.run_config import TournamentRunConfig
    from agentrt.tournaments.trainer import LeagueTrainer

    cfg = validate_config({
        "seed": 3, "run_dir": str(tmp_path), "progress": False, "threads": 1,
        "envs": [{"id": "TicTacToe-v0", "template": {"history": False}}],
        "policies": [{"id": "lm", "model": {"path": str(arch_dir)}, "lora": {"enabled": True},
                      "rollout": {"sampling": {"max_new_tokens": 3, "top_k": 10}},
                      "optim": {"lr": 1e-2}, "algorithm": {"advantage": "rae"}}],
        "baselines": [{"id": "random", "kind": "random", "seed": 1}],
        "runner": {"invalid_action": "retry", "max_retries": 2},
        "schedule": {"format": "pfsp", "snapshot": {"every": 1, "win_rate": None,
                                                    "min_steps": 1}},
        "train": {"steps": 2, "games_per_step": 4},
        "eval": {"every": 100, "games": 2}, "checkpoint": {"every": 2},
    }, TournamentRunConfig)
    LeagueTrainer(cfg).run()
    pool = load_checkpoint(RunDir(tmp_path).checkpoints()[-1])["pools"]["lm"]
    assert pool["policies"]["lm"]["version"] == 2
    snaps = pool["snapshots"]
    assert {"lm@0", "lm@1", "lm@2"} <= set(snaps)
    model, _ = load_model(arch_dir)
    targets = {k.split(".lora_")[0].rsplit(".", 1)[-1] for k in snaps["lm@1"]["weights"]}
    assert targets == set(lora_targets(model)[0])  # adapters on this architecture's layers
    a, b = snaps["lm@0"]["weights"], snaps["lm@1"]["weights"]
    assert any(not torch.equal(a[k], b[k]) for k in a)  # step 1 trained the adapter
    with MatchStore(tmp_path) as store:
        played = {key for r, _ in store.results() for key in r.match.keys}
    assert "lm" in played and played & {"lm@0", "lm@1"}


def test_decomposer_trains_its_lm_specialist(tmp_path, arch_dir):
    """A decomposer run whose every subtask goes to an LM specialist on the architecture (a
    rule planner splits each word chain): 2 SFT steps on its demonstrations change its weights,
    then it plays and is updated in each of 2 RL steps (an untrained nano model fails every
    chain alike, so the RL gradient may be zero: finite is what is checked there)."""
    from agentrt.decomposer.config import DecomposeConfig
    from agentrt.decomposer.workload import Decomposer

    skills = ["parse", "add", "sub", "mul", "div", "format"]
    Decomposer(validate_config({
        "seed": 0, "run_dir": str(tmp_path), "progress": False, "threads": 1,
        "family": {"name": "wordchain", "train_size": 32, "eval_size": 2, "seed": 5},
        "planner": {"kind": "rule", "max_subtasks": 4},
        "policies": [{"id": "solver", "model": {"path": str(arch_dir)}, "skills": skills,
                      "optim": {"lr": 1e-3},
                      "rollout": {"sampling": {"max_new_tokens": 6}}}],
        "chain": {"on_failure": "end"}, "sft": {"steps": 2, "batch_size": 4},
        "train": {"steps": 2, "tasks_per_step": 2, "group_size": 2},
        "eval": {"every": 100, "size": 2}, "checkpoint": {"every": 100},
    }, DecomposeConfig)).run()
    log = [r for r in rows(tmp_path) if r["step"] > 0]
    assert [r["step"] for r in log] == [1, 2]
    for r in log:
        assert math.isfinite(r["actor/loss"]) and math.isfinite(r["actor/grad_norm"])
    chains = [json.loads(line) for line in (tmp_path / "chains.jsonl").read_text().splitlines()]
    assert chains and all(s["policy"] == "solver" for c in chains for s in c["steps"])
    assert changed(arch_dir, tmp_path / "final" / "solver") > 0


def test_serve_answers_a_request(arch_dir):
    """One completion through the serving API (routes, batcher, model host) in this process,
    equal to greedy decoding by full forward passes."""
    from starlette.testclient import TestClient

    from agentrt.serving.api import Api
    from agentrt.serving.batcher import Batcher
    from agentrt.serving.host import ModelHost
    from agentrt.serving.protocol import encode_text
    from agentrt.serving.sources import find_sources

    models = ModelHost(find_sources(arch_dir, name="m"), "hf", max_batch=4, device="cpu")
    batcher = Batcher(models, 4).start()
    try:
        with TestClient(Api(models, batcher, max_tokens=4).app()) as client:
            res = client.post("/v1/completions", json={"model": "m", "prompt": "2+2=",
                                                       "temperature": 0, "max_tokens": 4})
    finally:
        batcher.stop()
        models.close()
    assert res.status_code == 200, res.text
    body = res.json()
    model, tok = load_model(arch_dir)
    prompt = encode_text(tok, "2+2=")  # bos first, as training prompts
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(body["usage"]["completion_tokens"]):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    want = tok.decode(ids[len(prompt):], skip_special_tokens=True)
    assert 1 <= body["usage"]["completion_tokens"] <= 4
    assert body["choices"][0]["text"] == want


def test_an_architecture_that_cannot_pack_trains_unpacked(tmp_path, caplog):
    """Falcon's attention ignores restarting position ids: with packing on (the default) the
    learner says so in one line and trains on padded rows instead of refusing the run."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = build_tokenizer()
    cfg = AutoConfig.for_model("falcon", vocab_size=len(tok), hidden_size=64,
                               num_hidden_layers=2, num_attention_heads=1, pad_token_id=0,
                               bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    folder = tmp_path / "falcon"
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    model, _ = load_model(folder)
    assert packed_attention(model, CPU, share_prefix=True) == (False, False)
    with caplog.at_level(logging.WARNING, logger="agentrt.runtime.forward"):
        Trainer(train_config(tmp_path / "run", folder, {"name": "grpo"})).run()
    (line,) = [r.getMessage() for r in caplog.records if "policy.packing" in r.getMessage()]
    assert "FalconForCausalLM does not confine attention" in line and "\n" not in line
    log = [r for r in rows(tmp_path / "run") if "actor/loss" in r]
    assert len(log) == 2 and all(math.isfinite(r["actor/loss"]) for r in log)
