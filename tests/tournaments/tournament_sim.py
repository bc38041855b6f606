"""Synthetic games with known win probabilities, shared by the tournament tests.

Outcome model: P[a scores] = sigma(s_a - s_b + seat bonus for seat 0), the Bradley-Terry model
with draws counting half. A draw happens with probability ``draw_scale * 2 * min(p, 1 - p)`` and
decisive games are split so the expected score of ``a`` is exactly ``p``. Each match's outcome is
seeded by its match id, so a replayed match has the same outcome (what a resumed run relies on).
"""

from __future__ import annotations

import math
import zlib
from typing import Callable

import numpy as np

from agentrt.tournaments.types import Match, MatchResult, Player


def play(match: Match, strength: Callable[[Player], float], draw_scale: float = 0.0,
         seat_bonus: float = 0.0, salt: int = 0) -> MatchResult:
    a, b = match.players
    p = 1.0 / (1.0 + math.exp(-(strength(a) - strength(b) + seat_bonus)))
    d = draw_scale * 2.0 * min(p, 1.0 - p)
    q = (p - d / 2.0) / (1.0 - d)
    rng = np.random.default_rng(zlib.crc32(match.match_id.encode()) + 7919 * salt)
    u = rng.random()
    if u < d:
        scores = (0.5, 0.5)
    elif u < d + (1.0 - d) * q:
        scores = (1.0, 0.0)
    else:
        scores = (0.0, 1.0)
    length = int(rng.integers(5, 10))
    invalid = tuple(int(rng.random() < 0.1) for _ in range(2))
    return MatchResult(match, scores, length, invalid, {"seed_salt": salt})
