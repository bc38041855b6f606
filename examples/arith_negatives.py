"""Hard negatives for an arithmetic reward model: wrong replies that look like right ones.

``examples/train_reward_model.py`` pairs each right answer with one of these (or with the
policy's own wrong samples). Each kind is ``kind(answer, rng) -> a wrong reply``; the
``tens_digit`` kind changes the digit a carry decides, which a reward read at the last token
alone does not check (docs/rewards.md).
"""

from __future__ import annotations

import random
from typing import Callable


def _digits(a: str) -> list[int]:
    """Positions of the digits of ``a`` (not its sign)."""
    return [i for i, c in enumerate(a) if c.isdigit()]


def _digit_changed(a: str, rng: random.Random) -> str:
    i = rng.choice(_digits(a))
    return a[:i] + str((int(a[i]) + rng.randint(1, 9)) % 10) + a[i + 1:]


def _digits_swapped(a: str, rng: random.Random) -> str:
    spots = [i for i in _digits(a)[:-1] if a[i + 1] != a[i]]
    if not spots:
        return _digit_changed(a, rng)
    i = rng.choice(spots)
    return a[:i] + a[i + 1] + a[i] + a[i + 2:]


def _digit_dropped(a: str, rng: random.Random) -> str:
    i = rng.choice(_digits(a))
    return a[:i] + a[i + 1:]


def _digit_added(a: str, rng: random.Random) -> str:
    i = rng.choice([*_digits(a), len(a)])
    return a[:i] + str(rng.randint(0, 9)) + a[i:]


def _tens_digit(a: str, rng: random.Random) -> str:
    """The tens digit replaced by another one (a nonzero one put in front of a 1-digit
    answer): a carry or tens-column mistake, the near miss a last-digit check passes."""
    spots = _digits(a)
    if len(spots) < 2:
        return a[:spots[0]] + str(rng.randint(1, 9)) + a[spots[0]:]
    i = spots[-2]
    digit = (int(a[i]) + rng.randint(1, 9)) % 10
    if i == spots[0] and digit == 0:  # no leading zero: that would be a dropped digit
        digit = rng.choice([d for d in range(1, 10) if d != int(a[i])])
    return a[:i] + str(digit) + a[i + 1:]


def _junk(rng: random.Random) -> str:
    return "".join(rng.choice("0123456789+=- x") for _ in range(rng.randint(1, 3)))


#: Kinds of hard negative: ``kind(answer, rng) -> a wrong reply`` (may equal ``answer`` by
#: chance; :func:`negative` redraws then).
NEGATIVES: dict[str, Callable[[str, random.Random], str]] = {
    "off_by_1": lambda a, rng: str(int(a) + rng.choice([-1, 1])),
    "off_by_10": lambda a, rng: str(int(a) + rng.choice([-10, 10])),
    "off_by_few": lambda a, rng: str(int(a) + rng.choice([-1, 1]) * rng.choice(
        [2, 3, 4, 5, 9, 11, 20, 100])),
    "digit_changed": _digit_changed,
    "digits_swapped": _digits_swapped,
    "digit_dropped": _digit_dropped,
    "digit_added": _digit_added,
    "sign": lambda a, rng: a[1:] if a.startswith("-") else "-" + a,
    "junk_after": lambda a, rng: a + _junk(rng),
    "repeated": lambda a, rng: a + a,
    "truncated": lambda a, rng: a[:rng.randrange(len(a))],
    "empty": lambda a, rng: rng.choice(["", " ", "="]),
    "tens_digit": _tens_digit,
}


def negative(kind: str, answer: str, rng: random.Random) -> str:
    """A wrong reply of ``kind`` to a question whose right reply is ``answer``."""
    for _ in range(20):
        out = NEGATIVES[kind](answer, rng)
        if out.strip() != answer:
            return out
    return answer + "0"
