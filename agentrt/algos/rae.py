"""Role-conditioned advantage estimation "rae" (SPIRAL, Liu et al. 2025, arXiv:2506.24119).

In zero-sum self-play the two roles of one game have different expected returns (first-mover
advantage), so one baseline for both biases each role's advantage. RAE keeps one exponential
moving average baseline per (env, role, policy) and subtracts it from the episode return:

    A_i = R_i - b[g_i]                                  (baseline as it was before this batch)
    b[g] <- alpha * b[g] + (1 - alpha) * mean_{i in batch, g_i = g} R_i     (alpha = 0.95)

Subtracting the baseline *before* folding in the batch keeps a sample out of its own baseline
(unbiased policy gradient). A group's baseline starts at its first batch's mean (``init="batch"``,
the default: the first batch then trains like a GRPO group); SPIRAL starts at 0 (``init="zero"``),
which in a league whose learner first loses most games keeps every advantage negative for tens
of steps, and each new opponent group starts cold again. The advantage is broadcast to
every generated token of the sequence, like GRPO.

State: the EMA lives in a :class:`RAEState` keyed by the trajectory's ``group_id``, which the
caller builds with :func:`rae_group_id` as ``"env|role|policy"``, so different envs, roles and
policies never share a baseline. The registered estimator keeps the one-signature rule
``fn(inputs, cfg) -> (advantages, returns)`` and reads the *current* state: the process-wide
:data:`RAE_BASELINES` unless a trainer selects its own with ``with use_rae_state(state): ...``.
See docs/tournaments.md ("RAE") for what the trainer must do.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

import torch

from agentrt.algos.advantages import ADVANTAGES, AdvantageInputs, _group_index

DEFAULT_ALPHA = 0.95  # SPIRAL's EMA decay


def rae_group_id(env: str, role: str, policy_id: str) -> str:
    """The group id RAE needs on every trajectory: ``"env|role|policy"``."""
    for name, part in (("env", env), ("role", role), ("policy_id", policy_id)):
        if not part or "|" in part:
            raise ValueError(f"rae_group_id: {name} {part!r} must be non-empty without '|'")
    return f"{env}|{role}|{policy_id}"


class RAEState:
    """EMA baselines per group id; thread-safe; serializable for checkpoints.

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
        self._b: dict[str, float] = {}
        self._n: dict[str, int] = {}  # updates per group, for inspection
        self._lock = threading.Lock()

    @classmethod
    def for_algorithm(cls, algo: Any) -> RAEState:
        """The state an ``AlgorithmConfig`` asks for (``rae_alpha``, ``rae_init``)."""
        return cls(alpha=algo.rae_alpha, init=algo.rae_init)

    def baseline(self, group_id: str) -> float:
        return self._b.get(group_id, 0.0)

    def step(self, group_ids: list[str], scores: torch.Tensor, alpha: float | None = None
             ) -> torch.Tensor:
        """Returns the [B] baselines before the update, then folds this batch into the EMAs.

        Args:
            group_ids: B group ids.
            scores: [B] episode returns.
            alpha: Overrides ``self.alpha`` for this update.
        """
        a = self.alpha if alpha is None else alpha
        with self._lock:
            means = {g: float(scores[torch.tensor(rows)].mean())
                     for g, rows in _group_index(group_ids).items()}
            if self.init == "batch":
                for g, mean in means.items():
                    self._b.setdefault(g, mean)
            base = torch.tensor([self._b.get(g, 0.0) for g in group_ids], dtype=scores.dtype)
            for g, batch_mean in means.items():
                self._b[g] = a * self._b.get(g, 0.0) + (1.0 - a) * batch_mean
                self._n[g] = self._n.get(g, 0) + 1
        return base

    def state_dict(self, policy_id: str | None = None) -> dict[str, Any]:
        """Baselines (all, or of one policy: groups ``"env|role|policy_id[|...]"``)."""
        keep = [g for g in self._b if policy_id is None or g.split("|")[2:3] == [policy_id]]
        return {"alpha": self.alpha, "init": self.init,
                "baselines": {g: [self._b[g], self._n[g]] for g in keep}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores baselines (merging: groups not in ``state`` are left as they are)."""
        with self._lock:
            self.alpha = float(state["alpha"])
            self.init = state.get("init", "zero")  # checkpoints from before ``init`` existed
            for g, (b, n) in state["baselines"].items():
                self._b[g], self._n[g] = float(b), int(n)

    def reset(self) -> None:
        with self._lock:
            self._b.clear()
            self._n.clear()


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


@ADVANTAGES.register("rae")
def rae(inp: AdvantageInputs, cfg: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Role-conditioned advantage (SPIRAL, arXiv:2506.24119): A_i = R_i - EMA baseline of
    (env, role, policy). Updates the EMA, so call it once per training batch.

    Shapes: returns ``(advantages [B, T], returns [B, T])`` zero off ``loss_mask``. The EMA
    decay is the state's (engines build it from ``algorithm.rae_alpha``, default 0.95).
    """
    bad = [g for g in set(inp.group_ids) if len(g.split("|")) < 3 or not all(g.split("|"))]
    if bad:
        raise ValueError(
            f"rae needs group ids 'env|role|policy' (build them with rae_group_id); got {bad[:3]}"
        )
    scores = inp.scores
    base = current_rae_state().step(inp.group_ids, scores)  # alpha: the state's own
    adv = (scores - base)[:, None] * inp.loss_mask
    return adv, adv.clone()
