"""Train a learned reward model for the arithmetic task: a small Llama sequence classifier
(one scalar head) that prefers the right answer, saved as a Hugging Face folder for
``reward: {model: FOLDER}``.

    python examples/train_reward_model.py --out runs/arith_rm            # llama-tiny, 2-digit +
    python examples/train_reward_model.py --out rm --steps 50 --preset llama-nano --digits 1

Data: prompts of the task's *training* split (the same generator and seed as
examples/arith_grpo.yaml, so the GRPO run's held-out prompts are never seen), each with its
right answer and a wrong one: near misses (off by 1, 2, 10, ...; a digit changed, digits
swapped, one digit dropped or added) and some malformed replies (letters, empty).

Training: first ``--lm-steps`` of next-token training on right answers (a reward model starts
from a model of the task, as RLHF reward models start from the SFT model: a classifier trained
from random weights on pairs alone learns the surface of answers, not the sums), then the
Bradley-Terry loss ``-log sigmoid(r(prompt, right) - r(prompt, wrong))`` on a scalar head.
Reported: accuracy on held-out pairs built from the task's eval split.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from agentrt.rewards.model import encode
from agentrt.tasks import make_splits


def wrong_answer(answer: str, rng: random.Random) -> str:
    """A plausible wrong reply to a question whose right reply is ``answer``."""
    value = int(answer)
    kind = rng.random()
    if kind < 0.45:
        out = str(max(0, value + rng.choice([-1, 1, -2, 2, -10, 10, -20, 20, -11, 11, 9, -9])))
    elif kind < 0.65:  # one digit changed
        i = rng.randrange(len(answer))
        out = answer[:i] + str((int(answer[i]) + rng.randint(1, 9)) % 10) + answer[i + 1:]
    elif kind < 0.75 and len(answer) > 1:  # digits swapped, dropped
        out = answer[::-1] if rng.random() < 0.5 else answer[:-1]
    elif kind < 0.85:  # a digit added
        out = answer + str(rng.randint(0, 9))
    else:  # malformed
        out = "".join(rng.choice("0123456789+= x") for _ in range(rng.randint(0, 4)))
    return out if out.strip() != answer else str(value + 1)


def pairs(examples: list[Any], rng: random.Random) -> list[tuple[str, str, str]]:
    """(prompt, right, wrong) per example."""
    return [(ex.prompt, ex.answer, wrong_answer(ex.answer, rng)) for ex in examples]


def build_classifier(preset: str, seed: int, init: str | None, lm_steps: int, lr: float,
                     batch_size: int, train_set: list[Any]) -> tuple[Any, Any]:
    """A 1-label LlamaForSequenceClassification with the byte tokenizer of agentrt's presets:
    its backbone from ``init`` (a causal-LM folder) or a fresh ``preset`` model, first trained
    ``lm_steps`` steps on ``prompt + answer + eos``; a fresh scalar head."""
    from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig,
                              LlamaForSequenceClassification)

    from agentrt.policies import build_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(init) if init else build_model(Path(tmp) / "base", preset, seed=seed)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        if lm_steps:
            lm = AutoModelForCausalLM.from_pretrained(folder)
            language_model(lm, tokenizer, train_set, lm_steps, lr, batch_size, seed)
            folder = Path(tmp) / "lm"
            lm.save_pretrained(folder)
        config = LlamaConfig.from_pretrained(folder, num_labels=1,
                                             pad_token_id=tokenizer.pad_token_id)
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification.from_pretrained(folder, config=config)
    return model, tokenizer


def language_model(lm: Any, tokenizer: Any, train_set: list[Any], steps: int, lr: float,
                   batch_size: int, seed: int) -> None:
    """Next-token training on the answers (loss on the answer and eos only)."""
    rng = random.Random(seed + 2)
    opt = torch.optim.AdamW(lm.parameters(), lr=lr)
    lm.train()
    for _ in range(steps):
        rows, labels = [], []
        for ex in rng.sample(train_set, min(batch_size, len(train_set))):
            prompt = [tokenizer.bos_token_id] + tokenizer.encode(ex.prompt,
                                                                 add_special_tokens=False)
            answer = tokenizer.encode(ex.answer, add_special_tokens=False) + [
                tokenizer.eos_token_id]
            rows.append(prompt + answer)
            labels.append([-100] * len(prompt) + answer)
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
        loss = lm(input_ids=ids, attention_mask=(lab != -100) | (ids != tokenizer.pad_token_id),
                  labels=lab).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()


def accuracy(model: Any, tokenizer: Any, data: list[tuple[str, str, str]]) -> float:
    """Share of pairs where the right answer scores above the wrong one."""
    model.eval()
    with torch.no_grad():
        good = model(**encode(tokenizer, [p for p, _, _ in data], [r for _, r, _ in data],
                              64)).logits[:, 0]
        bad = model(**encode(tokenizer, [p for p, _, _ in data], [w for _, _, w in data],
                             64)).logits[:, 0]
    model.train()
    return float((good > bad).float().mean())


def train(out: str | Path, preset: str = "llama-tiny", steps: int = 600, batch_size: int = 64,
          lr: float = 1e-3, seed: int = 0, digits: int = 2, ops: tuple[str, ...] = ("+",),
          train_size: int = 20000, eval_size: int = 256, task_seed: int = 1234,
          init: str | None = None, lm_steps: int = 300, lm_lr: float = 1e-3,
          log_every: int = 50) -> dict[str, float]:
    """Trains and saves the reward model to ``out``. Returns the final loss and held-out
    pair accuracy (also written to ``out/reward_model.json``)."""
    rng = random.Random(seed)
    options = {"digits": digits, "ops": list(ops)}
    train_set, eval_set = make_splits("arithmetic", options, train_size, eval_size, task_seed)
    heldout = pairs(eval_set, random.Random(seed + 1))
    model, tokenizer = build_classifier(preset, seed, init, lm_steps, lm_lr, batch_size,
                                        train_set)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, steps // 20)) * max(0.1, 1 - s / steps))
    loss = torch.tensor(0.0)
    for step in range(1, steps + 1):
        batch = pairs(rng.sample(train_set, min(batch_size, len(train_set))), rng)
        prompts = [p for p, _, _ in batch] * 2
        responses = [r for _, r, _ in batch] + [w for _, _, w in batch]
        scores = model(**encode(tokenizer, prompts, responses, 64)).logits[:, 0]
        good, bad = scores[:len(batch)], scores[len(batch):]
        loss = -F.logsigmoid(good - bad).mean()  # Bradley-Terry
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if log_every and step % log_every == 0:
            print(f"step {step:5d}  loss {loss.item():.4f}  held-out pair accuracy "
                  f"{accuracy(model, tokenizer, heldout):.3f}", flush=True)
    result = {"loss": loss.item(), "heldout_accuracy": accuracy(model, tokenizer, heldout),
              "steps": steps, "preset": preset, "digits": digits}
    out = Path(out)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "reward_model.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder to save the reward model to")
    ap.add_argument("--preset", default="llama-tiny")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--digits", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lm-steps", type=int, default=300,
                    help="next-token steps on right answers before the pairs")
    ap.add_argument("--init", default=None, help="causal-LM folder to start the backbone from")
    args = ap.parse_args()
    result = train(args.out, args.preset, args.steps, args.batch_size, args.lr, args.seed,
                   args.digits, init=args.init, lm_steps=args.lm_steps)
    print(f"saved {args.out}: held-out pair accuracy {result['heldout_accuracy']:.3f}")


if __name__ == "__main__":
    main()
