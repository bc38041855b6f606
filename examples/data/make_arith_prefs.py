"""Generates the built-in arithmetic preference data set from agentrt.envs.tasks, with a seed.

Each row's prompt comes from the training split of the arithmetic task (the task's held-out
prompts never appear), ``chosen`` is the correct answer and ``rejected`` a plausible wrong one:
last digit off by one, tens digit off by one, the carry dropped, digits swapped, a digit lost or
doubled. ``--shape listwise`` writes ``{prompt, responses, scores}`` rows (the correct answer
and up to three wrong ones, scored by closeness) and ``--shape unpaired`` ``{prompt, response,
desirable}`` rows (KTO).

Run:  python examples/data/make_arith_prefs.py  (writes examples/data/arith_pairs.jsonl)
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from agentrt.envs.tasks import make_splits


def _no_carry_sum(a: int, b: int) -> int:
    """a + b with every carry dropped, digit by digit (the classic carry error)."""
    out, place = 0, 1
    while a or b:
        out += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return out


def wrong_answers(a: int, b: int, value: int) -> list[int]:
    """Distinct plausible wrong answers to ``a + b = value`` (all >= 0, none equal to value;
    at least two, since value + 1 and value + 10 always qualify)."""
    text = str(value)
    cands = [value + 1, value - 1, value + 10, value - 10, _no_carry_sum(a, b),
             int(text[:-1] or "0"), int(text + text[-1])]
    if len(text) > 1:
        cands.append(int(text[:-2] + text[-1] + text[-2]))
    seen: list[int] = []
    for c in cands:
        if c >= 0 and c != value and c not in seen:
            seen.append(c)
    return seen


def make_rows(n: int, shape: str, seed: int, digits: int, task_seed: int, eval_size: int
              ) -> list[dict]:
    train, _ = make_splits("arithmetic", {"digits": digits, "ops": ["+"]}, n, eval_size,
                           task_seed)
    rng = random.Random(seed)
    rows = []
    for ex in train:
        a, b = (int(x) for x in ex.prompt.rstrip("=").split("+"))
        wrong = wrong_answers(a, b, int(ex.answer))
        if shape == "pairwise":
            rows.append({"prompt": ex.prompt, "chosen": ex.answer,
                         "rejected": str(rng.choice(wrong))})
        elif shape == "listwise":
            picks = rng.sample(wrong, min(3, len(wrong)))
            responses = [ex.answer] + [str(w) for w in picks]
            scores = [0.0] + [-float(abs(w - int(ex.answer))) for w in picks]
            order = list(range(len(responses)))
            rng.shuffle(order)
            rows.append({"prompt": ex.prompt, "responses": [responses[i] for i in order],
                         "scores": [scores[i] for i in order]})
        else:
            good = rng.random() < 0.5
            rows.append({"prompt": ex.prompt, "response": ex.answer if good else
                         str(rng.choice(wrong)), "desirable": good})
    return rows


def main() -> None:
    here = Path(__file__).parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=here / "arith_pairs.jsonl")
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--shape", choices=["pairwise", "listwise", "unpaired"], default="pairwise")
    ap.add_argument("--seed", type=int, default=0, help="Seed of the wrong-answer choice.")
    ap.add_argument("--digits", type=int, default=2)
    ap.add_argument("--task-seed", type=int, default=1234, help="task.seed of the configs.")
    ap.add_argument("--eval-size", type=int, default=256, help="task.eval_size of the configs.")
    args = ap.parse_args()
    rows = make_rows(args.rows, args.shape, args.seed, args.digits, args.task_seed,
                     args.eval_size)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} {args.shape} rows to {args.out}")


if __name__ == "__main__":
    main()
