"""Async rollout (train.async_rollout): staleness bound, behaviour log-probs in the PPO ratio,
exact resume, off by default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentrt.config.load import validate_config
from agentrt.config.sections import PolicyConfig
from agentrt.workloads.prompts.config import TrainConfig
from agentrt.controller.episodes import EpisodeLog
from agentrt.core.errors import ConfigError
from agentrt.runtime.pool import LocalPool
from agentrt.rewards import reward
from agentrt.workloads.prompts.workload import Trainer
from agentrt.core.types import Trajectory, Turn, collate


@reward("async_test_digits")
def digits(prompt: str, response: str, info: dict) -> float:
    """Dense signal, so every update moves the weights."""
    return sum(c.isdigit() for c in response) / max(1, len(response))


@pytest.fixture(scope="module")
def nano_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrt.policies.models import build_model

    return build_model(tmp_path_factory.mktemp("models") / "nano", "llama-nano", seed=0)


def config(run_dir: Path, model: Path, enabled: bool = True, steps: int = 5, lora: bool = False
           ) -> TrainConfig:
    return validate_config({
        "seed": 0, "run_dir": str(run_dir), "progress": False, "threads": 1,
        "task": {"name": "arithmetic", "train_size": 200, "eval_size": 8},
        "reward": "async_test_digits",
        "policy": {"model": {"path": str(model)}, "optim": {"lr": 3e-3},
                   "lora": {"enabled": lora}, "rollout": {"sampling": {"max_new_tokens": 4}}},
        "train": {"steps": steps, "prompts_per_step": 4, "group_size": 4,
                  "async_rollout": {"enabled": enabled, "max_staleness": 1}},
        "eval": {"every": 100}, "checkpoint": {"every": 3}}, TrainConfig)


def metrics(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text()
                                      .splitlines())}


def episodes(run_dir: Path, step: int) -> list[tuple]:
    return [(e.policy_version, e.prompt_ids, e.response_ids, e.logprobs)
            for e in EpisodeLog(run_dir).rows(step)]


def test_async_bounded_staleness_and_exact_resume(tmp_path, nano_dir):
    Trainer(config(tmp_path / "a", nano_dir)).run()
    rows = metrics(tmp_path / "a")
    # Step t trains at version t-1. Step 1 and the step after the checkpoint of step 3 are
    # played by the live weights; the others were generated during the previous update.
    behind = {1: 0, 2: 1, 3: 1, 4: 0, 5: 1}
    for step, lag in behind.items():
        versions = {v for v, *_ in episodes(tmp_path / "a", step)}
        assert versions == {step - 1 - lag}, (step, versions)
        assert rows[step]["rollout/staleness"] == lag <= 1
        assert rows[step]["async/dropped_stale"] == 0.0
        assert ("async/rollout_s" in rows[step]) == (lag == 1)  # prefetched, or played now

    # Killed with step 5's rollout in flight (after step 4, checkpoint at 3), then resumed:
    # the same prompts, samples and updates as the run that went through.
    Trainer(config(tmp_path / "b", nano_dir)).run(stop_after=4)
    Trainer(config(tmp_path / "b", nano_dir)).run()
    resumed = metrics(tmp_path / "b")
    for step in behind:
        assert episodes(tmp_path / "b", step) == episodes(tmp_path / "a", step), step
        for key in ("reward/mean", "actor/pg_loss", "actor/ppo_kl", "rollout/staleness"):
            assert resumed[step][key] == rows[step][key], (step, key)


def test_stale_samples_use_their_behaviour_logprobs(nano_dir):
    pool = LocalPool(PolicyConfig(model={"path": str(nano_dir)}, optim={"lr": 3e-3},
                                  rollout={"sampling": {"max_new_tokens": 4}}))
    copy = pool.rollout_copy()
    copy.start()
    prompts = [[pool.tokenizer.bos_token_id] + pool.tokenizer.encode(f"{i}+{i}=")
               for i in range(8)]

    def trajectories(completions: list, version: int) -> list[Trajectory]:
        return [Trajectory([Turn(p, c.response_ids, c.logprobs, reward=float(i % 2),
                                 policy_version=version)], group_id="g")
                for i, (p, c) in enumerate(zip(prompts, completions))]

    copy.sync()
    copy.reseed(0)
    old = trajectories(copy.generate(prompts, pool.cfg.rollout.sampling), copy.version)
    pool.train(trajectories(pool.generate(prompts), pool.version))  # version 0 -> 1
    assert [t.policy_version for t in old] == [0] * 8 and pool.version == 1
    batch = collate(old, pool.pad_id)
    now = pool.learner.logprobs(batch)  # the learner's log-probs at version 1
    mask = batch.loss_mask
    expected = float(((batch.old_logprobs - now) * mask).sum() / mask.sum())
    assert abs(expected) > 1e-4  # the update moved the policy: the lag is visible
    kl = pool.train(old)["actor/ppo_kl"]  # the ratio's first step: mean -log(pi_1 / pi_0)
    assert kl == pytest.approx(expected, abs=1e-5)
    # The same samples as if the current weights had drawn them: the ratio starts at 1.
    fresh = [Trajectory([Turn(t.turns[0].prompt_ids, t.turns[0].response_ids,
                              t.turns[0].logprobs, reward=t.turns[0].reward,
                              policy_version=pool.version)], group_id="g") for t in old]
    assert pool.train(fresh)["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    copy.close()


def test_lora_copy_shares_the_frozen_base(tmp_path, nano_dir):
    """A LoRA policy's copy holds its adapter alone: the base is the learner's own tensors (in
    shared memory), the adapter a tensor of its own that sync refreshes."""
    pool = LocalPool(PolicyConfig(model={"path": str(nano_dir)}, lora={"enabled": True},
                                  optim={"lr": 3e-2}, rollout={"sampling": {"max_new_tokens": 4}}))
    copy = pool.rollout_copy()
    live = dict(pool.worker.shared.model.named_parameters())
    mine = dict(copy.module.module.named_parameters())
    adapter = {k for k, p in live.items() if p.requires_grad}
    assert mine.keys() == live.keys() and adapter and all(".lora_" in k for k in adapter)
    for k, p in live.items():
        assert (mine[k].data_ptr() == p.data_ptr()) == (k not in adapter), k
        assert mine[k].is_shared() and not mine[k].requires_grad
    copy.start()
    prompts = [[pool.tokenizer.bos_token_id] + pool.tokenizer.encode(f"{i}+{i}=")
               for i in range(8)]

    def drawn(version: int) -> list[Trajectory]:
        copy.reseed(0)
        return [Trajectory([Turn(p, c.response_ids, c.logprobs, reward=float(i % 2),
                                 policy_version=version)], group_id="g")
                for i, (p, c) in enumerate(zip(prompts, copy.generate(
                    prompts, pool.cfg.rollout.sampling)))]

    def lag(samples: list[Trajectory]) -> float:
        """Largest gap between the copy's log-probs and the learner's on the copy's samples."""
        batch = collate(samples, pool.pad_id)
        return float(((batch.old_logprobs - pool.learner.logprobs(batch)) * batch.loss_mask)
                     .abs().max())

    copy.sync()
    pool.train(drawn(0))  # version 0 -> 1: the learner's adapter moves, the copy's does not
    assert any(not torch.equal(live[k], mine[k]) for k in adapter)
    assert lag(drawn(0)) > 1e-3
    copy.sync()
    assert all(torch.equal(live[k], mine[k]) for k in adapter) and copy.version == 1
    assert lag(drawn(1)) < 1e-4  # the rollout process reads the refreshed adapter
    copy.close()

    Trainer(config(tmp_path / "l", nano_dir, steps=3, lora=True)).run()
    rows = metrics(tmp_path / "l")
    assert [rows[s]["rollout/staleness"] for s in (1, 2, 3)] == [0, 1, 1]
    assert {v for v, *_ in episodes(tmp_path / "l", 3)} == {1}


def test_closing_a_copy_ends_its_process_even_one_that_does_not_answer(nano_dir):
    """close() asks the process to end, and terminates one that has not within its timeout
    (here: stopped by SIGSTOP, as a hung child would be); a dead one closes quietly."""
    import multiprocessing
    import os
    import signal

    def children() -> list:
        return [p for p in multiprocessing.active_children() if p.name.startswith("agentrt-")]

    pool = LocalPool(PolicyConfig(model={"path": str(nano_dir)},
                                  rollout={"sampling": {"max_new_tokens": 2}}))
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        copy = pool.rollout_copy()
        copy.start()
        copy.sync()
        assert len(copy.generate([[1, 5]], pool.cfg.rollout.sampling)) == 1
        [child] = children()
        os.kill(child.pid, sig)
        copy.close(timeout=1.0)
        assert children() == [] and child.exitcode is not None, sig


def test_off_by_default(tmp_path, nano_dir):
    assert TrainConfig().train.async_rollout.enabled is False
    trainer = Trainer(config(tmp_path / "s", nano_dir, enabled=False, steps=2))
    assert trainer.controller.prefetch is None
    trainer.run()
    rows = metrics(tmp_path / "s")
    assert sorted(rows) == [0, 1, 2]  # the step-0 evaluation, then the steps
    for step, row in rows.items():
        assert not [k for k in row if k.startswith("async/") or k == "rollout/staleness"]
        # every step played by the live weights (step 0 plays none): an empty log fails
        assert {v for v, *_ in episodes(tmp_path / "s", step)} == ({step - 1} if step else set())


@pytest.mark.parametrize("override, field", [
    ({"runtime": {"backend": "ray"}}, "runtime.backend: local"),
    ({"policy": {"algorithm": {"name": "grpo", "old_logprobs": "recompute"}}}, "old_logprobs"),
    ({"train": {"async_rollout": {"enabled": True, "max_staleness": 0}}}, "max_staleness"),
])
def test_bad_async_config(override, field):
    data = {"train": {"async_rollout": {"enabled": True}}, **override}
    with pytest.raises(ConfigError, match=field):
        validate_config(data, TrainConfig)


def test_samples_beyond_the_bound_are_generated_again(tmp_path, nano_dir):
    """Two updates while a rollout is in flight put its samples 2 versions behind: over
    max_staleness 1, so the step's prompts are played again by the live weights."""
    trainer = Trainer(config(tmp_path / "d", nano_dir))
    ctl, work = trainer.controller, trainer.workload
    try:
        work.start(ctl)
        ctl.prefetch.start(ctl)
        before = work.source.state_dict()
        ctl.prefetch.launch(ctl, work, 1)
        pool = ctl.pool_of(work.pid)
        extra = ctl.play(work, work.specs(work.source.next(4), group=True)).trajectories
        for t in extra:
            t.turns[-1].reward = float(len(t.turns[-1].response_ids) % 2)
        pool.train(extra)
        pool.train(extra)
        played, metrics = ctl.prefetch.rollout(ctl, work, 1)
        assert metrics["async/dropped_stale"] == 16.0 and metrics["rollout/staleness"] == 0.0
        assert {t.policy_version for t in played.trajectories} == {pool.version} == {2}
        work.source.load_state_dict(before)  # the prompts the launch drew
        launched = [ex.prompt for ex in work.source.next(4) for _ in range(4)]
        assert sorted(t.info["final_info"]["prompt"] for t in played.trajectories) == sorted(
            launched)
    finally:
        work.close()
        ctl.shutdown()
