"""Role-conditioned advantage estimation "rae" (SPIRAL, Liu et al. 2025, arXiv:2506.24119).

In zero-sum self-play the two roles of one game have different expected returns (first-mover
advantage), so one baseline for both biases each role's advantage. RAE keeps one exponential
moving average baseline per (env, role, policy) and subtracts it from the episode return. Each
trajectory i of a batch, in batch order, is measured and then folded in:

    A_i = R_i - b[g_i]                                  (baseline before trajectory i is folded)
    b[g_i] <- alpha * b[g_i] + (1 - alpha) * R_i        (alpha = 0.95)

This is SPIRAL's loop (spiral-rl/spiral, ``train_spiral.py``, ``prepare_trajectories``: per game
and player, ``baseline = ema.get()`` "before updating to be unbiased", then ``ema.update(reward)``,
then ``reward -= baseline``), so two choices follow SPIRAL:

* A trajectory's advantage uses the baseline *before its own* update: a sample is not in its
  own baseline, which keeps the policy gradient unbiased.
* The advantages of a batch are *not* all measured against the baseline from before the batch:
  trajectory i sees the trajectories before it in the same batch. SPIRAL folds each game as it is
  played; folding a batch mean once per step instead (what agentrt did before) makes alpha a decay
  per *step*, so with 64 games of a group per step the baseline needed ~60 steps (0.95^59 < 0.05)
  to follow a change of win rate that per-trajectory folding follows within one step
  (0.95^64 = 0.04). The earlier trajectories are other games, independent of trajectory i, so
  the baseline stays unbiased.

A "trajectory" is one row of the batch. A league trainer that splits a game into one row per
turn (``history: false``) folds each turn's row, where SPIRAL folds once per game and player: a
game of k turns then moves the baseline k times, and its later turns see its earlier turns'
return in their baseline.

A group's baseline starts at its first batch's mean (``init="batch"``, the default: the first
batch then trains about like a GRPO group, its samples inside their own baseline, then each is
folded in as above); SPIRAL starts at 0 (``init="zero"``: its ``EMA`` starts at 0.0). With the
per-batch folding agentrt had before, a zero start kept every advantage negative for tens of steps
in a league whose learner first loses most games (and each new opponent group started cold
again); folding per trajectory, it costs the first few tens of games of a group. The advantage is
broadcast to every generated token of the sequence, like GRPO.

State: the EMA lives in a :class:`RAEState` keyed by the trajectory's ``group_id``, a
:class:`~agentrt.core.types.GroupKey` (the episode runner builds it; every key names its env,
role and policy), so different envs, roles and policies never share a baseline. The registered
estimator keeps the one-signature rule ``fn(inputs, cfg) -> (advantages, returns)`` and reads
the *current* state: the process-wide
:data:`RAE_BASELINES` unless a trainer selects its own with ``with use_rae_state(state): ...``.
See docs/tournaments.md ("RAE") for what the trainer must do.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from array import array
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

import torch

from agentrt.algos.advantages import AdvantageInputs, _group_index
from agentrt.core.types import GroupKey

DEFAULT_ALPHA = 0.95  # SPIRAL's EMA decay


class RAEState:
    """EMA baselines per group key; thread-safe; serializable for checkpoints (keys as their
    plain ``str`` form, :meth:`GroupKey.parse` back).

    Args:
        alpha: EMA decay (weight of the old baseline per update).
        init: A new group's baseline: "batch" (its first batch's mean) or "zero" (SPIRAL).
    """

    def __init__(self, alpha: float = DEFAULT_ALPHA, init: str = "batch") -> None:
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"RAE alpha must be in [0, 1), got {alpha}")
        if init not in ("batch", "zero"):
            raise ValueError(f"RAE init must be 'batch' or 'zero', got {init!r}")
        self.alpha, self.init = alpha, init
        self._b: dict[GroupKey, float] = {}
        # Trajectories folded per group, for inspection (states saved before per-trajectory
        # folding counted batches; their baselines load and continue unchanged).
        self._n: dict[GroupKey, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_algorithm(cls, algo: Any) -> RAEState:
        """The state an ``AlgorithmConfig`` asks for (``rae_alpha``, ``rae_init``)."""
        return cls(alpha=algo.rae_alpha, init=algo.rae_init)

    def baseline(self, group_id: GroupKey) -> float:
        return self._b.get(group_id, 0.0)

    def step(self, group_ids: list[GroupKey], scores: torch.Tensor, alpha: float | None = None
             ) -> torch.Tensor:
        """Folds the batch into the EMAs one trajectory at a time, in batch order; returns the
        [B] baselines each trajectory was measured against (its group's, before its own fold).

        Args:
            group_ids: B group keys.
            scores: [B] episode returns.
            alpha: Overrides ``self.alpha`` for this update.
        """
        a = self.alpha if alpha is None else alpha
        returns = scores.detach().double().tolist()
        parents = [state_parent(g) for g in group_ids]
        with self._lock:
            if self.init == "batch":  # a new group starts at its first batch's mean
                for g, rows in _group_index([p or g for p, g in zip(parents, group_ids)]).items():
                    if g not in self._b:
                        self._b[g] = sum(returns[i] for i in rows) / len(rows)
                        self._n[g] = 0
            base = []
            for g, parent, r in zip(group_ids, parents, returns):
                if parent is not None:  # a state's baseline starts at its role's, then its own
                    if g not in self._b:
                        self._b[g], self._n[g] = self._b.get(parent, 0.0), 0
                    pb = self._b.get(parent, 0.0)
                    self._b[parent] = a * pb + (1.0 - a) * r
                    self._n[parent] = self._n.get(parent, 0) + 1
                b = self._b.get(g, 0.0)
                base.append(b)
                self._b[g] = a * b + (1.0 - a) * r
                self._n[g] = self._n.get(g, 0) + 1
        return torch.tensor(base, dtype=scores.dtype)

    def state_dict(self, policy_id: str | None = None) -> dict[str, Any]:
        """Baselines (all, or those of one policy), keyed by ``str(group key)``."""
        keep = [g for g in self._b if policy_id is None or g.policy == policy_id]
        return {"alpha": self.alpha, "init": self.init,
                "baselines": {str(g): [self._b[g], self._n[g]] for g in keep}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores baselines (merging: groups not in ``state`` are left as they are)."""
        with self._lock:
            self.alpha = float(state["alpha"])
            self.init = state.get("init", "zero")  # checkpoints from before ``init`` existed
            for text, (b, n) in state["baselines"].items():
                g = GroupKey.parse(text)
                self._b[g], self._n[g] = float(b), int(n)

    def reset(self) -> None:
        with self._lock:
            self._b.clear()
            self._n.clear()


STATE_PREFIX = "state="


def state_key(group: GroupKey, prompt_ids: list[int]) -> GroupKey:
    """The per-state group of a one-turn row (``algorithm.rae_per_state``): its role group's
    key with the prompt's digest and the opponents as its task, so one state against one line
    of opponents shares a baseline (the prompt is the state the policy saw)."""
    digest = hashlib.blake2b(array("q", prompt_ids).tobytes(), digest_size=8).hexdigest()
    opponents = ",".join(group.opponents or ())
    return dataclasses.replace(group, opponents=None,
                               task=f"{STATE_PREFIX}{digest}/vs={opponents}")


def state_parent(group: Any) -> GroupKey | None:
    """The role group a per-state group (:func:`state_key`) falls back to; None for others."""
    task = getattr(group, "task", None)
    if not task or not task.startswith(STATE_PREFIX):
        return None
    names = task.partition("/vs=")[2]
    return dataclasses.replace(group, task=None,
                               opponents=tuple(names.split(",")) if names else ())


RAE_BASELINES = RAEState()  # process-wide default state
_CURRENT: ContextVar[RAEState | None] = ContextVar("rae_state", default=None)


@contextmanager
def use_rae_state(state: RAEState) -> Iterator[RAEState]:
    """Makes ``ADVANTAGES["rae"]`` read and update ``state`` inside the ``with`` block."""
    token = _CURRENT.set(state)
    try:
        yield state
    finally:
        _CURRENT.reset(token)


def current_rae_state() -> RAEState:
    return _CURRENT.get() or RAE_BASELINES


def rae(inp: AdvantageInputs, cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Role-conditioned advantage (SPIRAL, arXiv:2506.24119): A_i = R_i - EMA baseline of
    (env, role, policy), each trajectory folded into the EMA after its advantage, in batch order.
    Updates the EMA, so call it once per training batch.

    Shapes: returns ``(advantages [B, T], returns [B, T])`` zero off ``loss_mask``. The EMA
    decay is the state's (engines build it from ``algorithm.rae_alpha``, default 0.95).
    """
    bad = [g for g in dict.fromkeys(inp.group_ids)
           if not (isinstance(g, GroupKey) and g.env and g.role and g.policy)]
    if bad:
        raise ValueError(f"rae needs GroupKey group ids naming env, role and policy (the episode "
                         f"runner builds them); got {bad[:3]}")
    scores = inp.scores
    base = current_rae_state().step(inp.group_ids, scores)  # alpha: the state's own
    adv = (scores - base)[:, None] * inp.loss_mask
    return adv, adv.clone()
