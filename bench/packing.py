"""Padding in the trainer's forward passes: padded rows against length buckets and packing.

A fixed GRPO-shaped batch of rollouts (32 two-digit addition prompts x 8 responses, as
examples/arith_grpo.yaml trains) goes through the trainer step (``prepare``, advantages,
``update``) of three engines over the same model folder:

* ``padded``: ``micro_batch_size: 256``, the arithmetic job's setting: every row padded to the
  batch's longest (what the trainer computed before micro-batches were cut to their own rows);
* ``bucketed``: ``micro_batch_tokens: --budget``: rows sorted by length, micro-batches of at most
  that many padded positions, each cut to its own longest row;
* ``packed``: ``packing: true, share_prefix: false``: sequences concatenated into rows of
  max(64, longest) positions, position ids restarting, attention confined to each sequence (one
  micro-batch);
* ``shared``: ``packing: true`` with the default ``share_prefix: true``: besides, a group's 8 rows
  compute their prompt once (a 4D mask lets each response attend to the prompt and itself).

Two batches: ``arith`` (responses as a warm-started policy writes them: the answer or a wrong
number of 1-4 digits, then eos; 2-7 tokens) and ``long`` (the same prompts, responses of 4-64
tokens drawn uniformly, as when sampling with max_new_tokens 64 stops at eos anywhere).

Printed per batch and arm: positions computed, how many were padding (perf/padded_tokens) and
how many prompt tokens were not computed again (perf/shared_tokens),
trainer samples/s by wall clock and by this process's CPU time (median over interleaved
repetitions, the arms' order rotating; CPU time is the steadier one on a shared machine) and the
ratios to ``padded``; then the equality check: max |log-prob - padded log-prob|, the loss difference and
max |weight step - padded weight step| of one update (AdamW with eps 1 and lr 1, whose first step
is ~ the clipped gradient), relative to the largest step.

Run:  .venv/bin/python bench/packing.py [--preset llama-tiny] [--reps 7] [--budget 1024]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from agentrt.algos.config import AlgorithmConfig
from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import ModelConfig, PolicyConfig
from agentrt.algos.rae import RAEState
from agentrt.runtime.learner import Learner
from agentrt.runtime.steps import advantages_from
from agentrt.policies.models import build_model
from agentrt.envs.tasks import encode_prompt, make_splits
from agentrt.core.types import TrainBatch, Trajectory, Turn, collate

PROMPTS, GROUP = 32, 8


def rollouts(tokenizer, long: bool, seed: int = 0) -> TrainBatch:
    """The fixed batch: 32 prompts x 8 responses with GRPO groups and 0/1 rewards."""
    rng = random.Random(seed)
    train, _ = make_splits("arithmetic", {"digits": 2}, PROMPTS, 1, seed)
    eos = tokenizer.eos_token_id
    trajs = []
    for g, ex in enumerate(train):
        prompt = encode_prompt(tokenizer, ex.prompt)
        for _ in range(GROUP):
            if long:
                response = [rng.randrange(3, 259) for _ in range(rng.randint(3, 63))] + [eos]
                reward = float(rng.random() < 0.3)
            else:
                right = rng.random() < 0.4
                text = ex.answer if right else str(rng.randrange(10 ** rng.randint(1, 4)))
                response = tokenizer.encode(text, add_special_tokens=False) + [eos]
                reward = float(right)
            trajs.append(Trajectory([Turn(prompt, response, [-1.0] * len(response),
                                          reward=reward)], group_id=str(g)))
    return collate(trajs, tokenizer.pad_token_id)


def engine(folder: Path, budget: int | None, packing: bool, share: bool = False,
           optim: dict | None = None) -> Learner:
    cfg = PolicyConfig(model=ModelConfig(path=str(folder)), micro_batch_size=PROMPTS * GROUP,
                       micro_batch_tokens=budget, packing=packing, share_prefix=share and packing,
                       algorithm=AlgorithmConfig(name="grpo", kl={"coef": 0.0}),
                       rollout={"sampling": SamplingConfig(temperature=1.0, max_new_tokens=64)},
                       optim=optim or {"lr": 1e-6})
    return Learner(cfg, seed=0)


def train_step(eng: Learner, batch: TrainBatch
               ) -> tuple[tuple[float, float], dict[str, float]]:
    """(wall, CPU) seconds of one trainer step on a copy of ``batch``, and its metrics."""
    b = batch.select(list(range(batch.size)))
    wall, cpu = time.perf_counter(), time.process_time()
    metrics = eng.prepare(b)
    metrics |= advantages_from(b, eng.algo, eng.kl_coef, RAEState.for_algorithm(eng.algo))
    metrics |= eng.update(b)
    return (time.perf_counter() - wall, time.process_time() - cpu), metrics


def weight_step(eng: Learner, batch: TrainBatch) -> tuple[torch.Tensor, float]:
    before = [p.detach().clone() for p in eng.parameters()]
    _, metrics = train_step(eng, batch)
    step = torch.cat([(p.detach() - q).flatten() for p, q in zip(eng.parameters(), before)])
    return step, metrics["actor/pg_loss"]


def run_batch(name: str, folder: Path, arms: dict, batch: TrainBatch, reps: int) -> None:
    lengths = batch.attention_mask.sum(-1)
    print(f"\n== {name}: {batch.size} rows, {int(lengths.sum())} tokens, lengths "
          f"{int(lengths.min())}-{int(lengths.max())} (padded width {batch.input_ids.shape[1]})")
    engines = {arm: engine(folder, *kw) for arm, kw in arms.items()}
    pads = {}
    for arm, eng in engines.items():  # warm-up, and the padding of one step
        eng.passes.padding_metrics()
        _, m = train_step(eng, batch)
        pads[arm] = m
    times: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
    order = list(arms)
    for rep in range(reps):
        for arm in order[rep % len(order):] + order[:rep % len(order)]:
            times[arm].append(train_step(engines[arm], batch)[0])
    def rate(arm: str, clock: int) -> float:
        return batch.size / statistics.median(t[clock] for t in times[arm])

    print(f"{'arm':9s} {'computed':>9s} {'padded':>8s} {'pad %':>6s} {'shared':>7s} "
          f"{'samples/s':>10s} {'ratio':>6s} {'CPU-time':>9s} {'ratio':>6s}  "
          f"(median of {reps}, interleaved)")
    for arm in arms:
        padded, frac = pads[arm]["perf/padded_tokens"], pads[arm]["perf/pad_fraction"]
        shared = pads[arm]["perf/shared_tokens"]
        computed = float(lengths.sum()) - shared + padded
        print(f"{arm:9s} {computed:9.0f} {padded:8.0f} {100 * frac:6.1f} {shared:7.0f} "
              f"{rate(arm, 0):10.1f} "
              f"{rate(arm, 0) / rate('padded', 0):6.2f} {rate(arm, 1):9.1f} "
              f"{rate(arm, 1) / rate('padded', 1):6.2f}")
    # equality: fresh engines from the same weights, one step each
    lps = {arm: engine(folder, *kw).logprobs(batch) for arm, kw in arms.items()}
    steps = {arm: weight_step(engine(folder, *kw, optim={"lr": 1.0, "eps": 1.0}), batch)
             for arm, kw in arms.items()}
    scale = float(steps["padded"][0].abs().max())
    for arm in list(arms)[1:]:
        print(f"{arm} vs padded: max |log-prob diff| "
              f"{float((lps[arm] - lps['padded']).abs().max()):.2e}, loss diff "
              f"{abs(steps[arm][1] - steps['padded'][1]):.2e}, max |weight step diff| "
              f"{float((steps[arm][0] - steps['padded'][0]).abs().max()):.2e} "
              f"(largest step {scale:.2e})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-tiny")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--budget", type=int, default=1024, help="bucketed arm's micro_batch_tokens")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="arith,long")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = build_model(Path(tempfile.mkdtemp(prefix="bench-packing-")) / args.preset,
                         args.preset, seed=0)
    tokenizer = engine(folder, None, False).tokenizer
    arms = {"padded": (None, False), "bucketed": (args.budget, False), "packed": (None, True),
            "shared": (None, True, True)}
    print(f"{args.preset}, {args.threads} threads, bucketed budget {args.budget} positions")
    for name in args.batches.split(","):
        run_batch(name, folder, arms, rollouts(tokenizer, long=name == "long"), args.reps)


if __name__ == "__main__":
    main()
