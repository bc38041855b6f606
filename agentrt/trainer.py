"""Single-policy training on a verifiable task: optional SFT warm start, then GRPO/PPO/RLOO/...

This is the special case of the runtime with one policy and no opponents. The loop in
:meth:`Trainer.run` is the whole algorithm: sample prompts, roll out, score, prepare, compute
advantages, update, evaluate, checkpoint.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

import torch

from agentrt.config import SamplingConfig, TrainConfig, dump_config
from agentrt.controller import make_pool
from agentrt.engine import HybridEngine
from agentrt.errors import ConfigError
from agentrt.plot import plot_metrics
from agentrt.progress import StepProgress
from agentrt.rewards import RewardFn, exact_match, resolve_reward, score
from agentrt.run import RunDir, Timer, load_checkpoint, rng_state, seed_everything, set_rng_state
from agentrt.tasks import Example, make_splits
from agentrt.types import Trajectory, Turn, collate

log = logging.getLogger(__name__)


class PromptSampler:
    """Epoch-wise shuffled pass over the training examples; its position is checkpointed."""

    def __init__(self, examples: list[Example], seed: int) -> None:
        self.examples = examples
        self.seed = seed
        self.epoch = 0
        self.pos = 0
        self._order = self._shuffle()

    def _shuffle(self) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(self.seed * 100_003 + self.epoch).shuffle(order)
        return order

    def next(self, n: int) -> list[Example]:
        out = []
        for _ in range(n):
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._shuffle()
            out.append(self.examples[self._order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._shuffle()


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """bos + the prompt's ids (our tokenizers add no specials by themselves)."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return bos + tokenizer.encode(text, add_special_tokens=False)


@dataclass
class Rollout:
    trajectories: list[Trajectory]
    responses: list[str]
    reward_errors: int
    seconds: float = 0.0


def rollout(engine: HybridEngine, examples: list[Example], group_size: int, reward_fn: RewardFn,
            task: str, sampling: SamplingConfig | None = None) -> Rollout:
    """``group_size`` responses per example, scored; one trajectory per response.

    Group ids are ``task|role|policy|example`` so that group baselines never mix prompts,
    roles or policies.
    """
    prompts = [encode_prompt(engine.tokenizer, ex.prompt) for ex in examples]
    flat = [(i, p) for i, p in enumerate(prompts) for _ in range(group_size)]
    completions = engine.generate([p for _, p in flat], sampling)
    texts = engine.tokenizer.batch_decode([c.response_ids for c in completions],
                                          skip_special_tokens=True)
    rewards, errors = score(reward_fn, [(examples[i].prompt, t, examples[i].info)
                                        for (i, _), t in zip(flat, texts)])
    trajs = []
    for (i, prompt), comp, r in zip(flat, completions, rewards):
        turn = Turn(prompt, comp.response_ids, comp.logprobs, reward=r, policy_id=engine.policy_id,
                    policy_version=engine.version, finished=comp.finished)
        trajs.append(Trajectory([turn], group_id=f"{task}|agent|{engine.policy_id}|{i}",
                                env=task, policy_id=engine.policy_id))
    return Rollout(trajs, texts, errors)


def evaluate(engine: HybridEngine, examples: list[Example], reward_fn: RewardFn, task: str,
             greedy: bool = True) -> dict[str, float]:
    """Held-out metrics: exact-match accuracy, mean reward, response length."""
    sampling = engine.cfg.rollout.sampling
    if greedy:
        sampling = sampling.model_copy(update={"temperature": 0.0})
    out = rollout(engine, examples, 1, reward_fn, task, sampling)
    accuracy = sum(exact_match(ex.prompt, text, ex.info) for ex, text in
                   zip(examples, out.responses)) / len(examples)
    lengths = [len(t.turns[0].response_ids) for t in out.trajectories]
    return {"eval/accuracy": accuracy,
            "eval/reward": sum(t.reward for t in out.trajectories) / len(examples),
            "eval/response_length": sum(lengths) / len(lengths)}


def demonstrations(engine: HybridEngine, examples: list[Example]) -> list[Trajectory]:
    """SFT data: prompt ids + answer ids + eos, loss on the answer only."""
    tok = engine.tokenizer
    trajs = []
    for ex in examples:
        response = tok.encode(ex.answer, add_special_tokens=False) + [engine.eos_id]
        trajs.append(Trajectory([Turn(encode_prompt(tok, ex.prompt), response,
                                      [0.0] * len(response))]))
    return trajs


class Trainer:
    """Runs ``agentrt train``: builds the engine, resumes if a checkpoint exists, loops."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.run_dir = RunDir(cfg.run_dir)
        self.reward_fn = resolve_reward(cfg.reward)
        t = cfg.task
        self.train_set, self.eval_set = make_splits(t.name, t.options, t.train_size,
                                                    t.eval_size, t.seed)
        seed_everything(cfg.seed)
        if cfg.runtime.backend == "ray" and getattr(cfg.policy.algorithm, "is_preference", False):
            raise ConfigError("preference algorithms run in-process for now; set "
                              "runtime.backend: local")
        # The policy's pool: in-process (runtime.backend: local) or Ray actors ('ray').
        self.pool = make_pool(cfg.policy, cfg.runtime, seed=cfg.seed,
                              total_steps=cfg.train.steps, workdir=self.run_dir.path)
        self.engine = getattr(self.pool, "engine", None)  # in-process only (None on Ray)
        self.sampler = PromptSampler(self.train_set, cfg.seed)
        self.timer = Timer()
        self.step = 0

    # -------------------------------------------------------------- the loop
    def run(self, stop_after: int | None = None) -> dict[str, float]:
        """Trains to ``train.steps`` (or stops after ``stop_after`` more steps, as if killed).

        Returns the last metrics row (with eval) for callers and tests.
        """
        if self.cfg.policy.algorithm.is_preference:  # dpo, ipo, kto, listwise: no advantages
            from agentrt.preference import PreferenceLoop

            return PreferenceLoop(self).run(stop_after)
        cfg, pool = self.cfg, self.pool
        self.run_dir.write_config(dump_config(cfg))
        if not self._resume():
            last = self._warm_start()
        else:
            last = {}
        bar = StepProgress(cfg.train.steps, enabled=cfg.progress, start=self.step)
        try:
            while self.step < cfg.train.steps:
                if stop_after is not None and stop_after <= 0:
                    break
                examples = self.sampler.next(cfg.train.prompts_per_step)
                with self.timer("rollout"):
                    out = rollout(pool, examples, cfg.train.group_size, self.reward_fn,
                                  cfg.task.name)
                metrics = pool.train(out.trajectories)  # prepare, advantages, update (timed)
                self.step += 1
                metrics |= self._rollout_metrics(out) | self.timer.pop()
                if self.step % cfg.eval.every == 0 or self.step == cfg.train.steps:
                    metrics |= evaluate(pool, self.eval_set, self.reward_fn, cfg.task.name,
                                        cfg.eval.greedy)
                self.run_dir.log_metrics(self.step, metrics)
                last = metrics
                bar.update(self.step, metrics)
                if self.step % cfg.checkpoint.every == 0 or self.step == cfg.train.steps:
                    self.save()
                if stop_after is not None:
                    stop_after -= 1
            if self.step == cfg.train.steps:
                pool.save_pretrained(self.run_dir.path / "final_model")
        except KeyboardInterrupt:
            log.warning("interrupted at step %d; the last checkpoint is resumable", self.step)
            raise
        finally:
            bar.close()
            plot_metrics(self.run_dir.read_metrics(), self.run_dir.path / "curves.png")
            pool.shutdown()  # Ray: workers killed, Ray stopped if this run started it
        return last

    def _warm_start(self) -> dict[str, float]:
        """SFT warm start (when configured), step-0 eval and the step-0 checkpoint."""
        cfg = self.cfg
        metrics: dict[str, float] = {}
        if cfg.sft.steps:
            with self.timer("sft"):
                metrics |= self.sft()
        metrics |= evaluate(self.pool, self.eval_set, self.reward_fn, cfg.task.name,
                            cfg.eval.greedy) | self.timer.pop()
        self.run_dir.log_metrics(0, metrics)
        self.save()
        return metrics

    def sft(self) -> dict[str, float]:
        """Supervised warm start on demonstrations from the training split."""
        s, pool = self.cfg.sft, self.pool
        sampler = PromptSampler(self.train_set, self.cfg.seed + 1)
        bar = StepProgress(s.steps, enabled=self.cfg.progress, label="sft")
        metrics: dict[str, float] = {}
        for i in range(s.steps):
            metrics = pool.sft_step(demonstrations(pool, sampler.next(s.batch_size)), s)
            bar.update(i + 1, {"sft/loss": metrics["sft/loss"]})
        bar.close()
        pool.end_sft()  # RL starts from version 0 of the warm-started policy
        return metrics

    def _rollout_metrics(self, out: Rollout, batch: Any = None) -> dict[str, float]:
        rewards = torch.tensor([t.reward for t in out.trajectories])
        lengths = torch.tensor([len(t.turns[0].response_ids) for t in out.trajectories],
                               dtype=torch.float32)
        finished = sum(t.turns[0].finished for t in out.trajectories) / len(out.trajectories)
        rollout_s = self.timer.times.get("rollout", 0.0)
        return {
            "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()),
            "reward/errors": float(out.reward_errors),
            "rollout/response_length": float(lengths.mean()), "rollout/finished_rate": finished,
            "perf/tokens_per_s": float(lengths.sum()) / max(rollout_s, 1e-9),
        } | ({} if batch is None else {"perf/train_tokens": float(batch.num_tokens)})

    # -------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "pool": self.pool.state_dict(),
                "sampler": self.sampler.state_dict(), "rng": rng_state()}

    def save(self) -> None:
        self.run_dir.save_checkpoint(self.step, self.state_dict(), self.cfg.checkpoint.keep)

    def _resume(self) -> bool:
        ckpt = self.run_dir.latest_checkpoint()
        if ckpt is None:
            return False
        state = load_checkpoint(ckpt)
        self.step = state["step"]
        set_rng_state(state["rng"])  # first: the pool's RNG (it sampled the rollouts) wins
        self.pool.load_state_dict(state["pool"])
        self.sampler.load_state_dict(state["sampler"])
        self.run_dir.truncate_metrics(self.step)
        log.warning("resumed from %s (step %d)", ckpt, self.step)
        return True
