"""KL divergence to the reference policy: per-token estimators and coefficient controllers.

Estimators follow http://joschu.net/blog/kl-approx.html with log r = ref_logp - logp (samples
drawn from the current policy): k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r (unbiased,
>= 0).

k3 is verl's "low_var_kl" and is clamped the way verl does it (``core_algos.kl_penalty``): the
log-ratio to [-20, 20] so exp cannot overflow, and the estimate itself to [-10, 10] (k3 >= 0, so
in effect to at most 10). Unclamped, a token the reference finds e^15 times likelier than the
policy does costs exp(15) - 16 = 3.3e6 and swamps every other term of the loss; clamped, it adds
10 and passes no gradient. For log r in [-11, 2.6] the value is the exact k3, so the estimate is
biased (downwards) only on tokens outside that range.
"""

from __future__ import annotations

from typing import Any

import torch


def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp - ref_logp) ** 2


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """verl's "low_var_kl": (r - 1) - log r with log r = ref_logp - logp, clamped to [-10, 10].

    Shapes: ``logp``, ``ref_logp`` [B, T] (any equal shapes); returns the same shape.
    """
    # Clamp the log-ratio so exp cannot overflow, then the estimate so one runaway token cannot
    # dominate the loss (both as verl's kl_penalty "low_var_kl").
    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)


class KLController:
    """Holds the KL coefficient beta; ``update`` is called once per training step."""

    def __init__(self, coef: float) -> None:
        self.coef = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:  # noqa: ARG002 - fixed ignores
        return None

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef = float(state["coef"])


class AdaptiveKLController(KLController):
    """Adaptive beta (Ziegler et al. 2019, arXiv:1909.08593, section 2.2): moves beta so the
    observed KL approaches ``target`` over ``horizon`` samples, with the error clipped to +-0.2."""

    def __init__(self, coef: float, target: float, horizon: int) -> None:
        super().__init__(coef)
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + error * n_steps / self.horizon


class DecayKLController(KLController):
    """beta_t = beta_0 * h / (h + t) after t updates (``half_life`` h): halves after h updates,
    tends to 0. With a fixed reference the regularised equilibrium it holds the policy to moves
    toward the game's equilibrium as beta falls (the annealed form of magnetic mirror descent,
    Sokota et al. 2023, arXiv:2206.05825, section 4)."""

    def __init__(self, coef: float, half_life: int) -> None:
        super().__init__(coef)
        self.start = float(coef)
        self.half_life = int(half_life)
        self.updates = 0

    def update(self, current_kl: float, n_steps: int) -> None:  # noqa: ARG002 - counts updates
        self.updates += 1
        self.coef = self.start * self.half_life / (self.half_life + self.updates)

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef, "updates": self.updates}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef = float(state["coef"])
        self.updates = int(state.get("updates", 0))


def fixed_controller(cfg: Any) -> KLController:
    return KLController(cfg.coef)


def adaptive_controller(cfg: Any) -> KLController:
    return AdaptiveKLController(cfg.coef, cfg.target, cfg.horizon)


def decay_controller(cfg: Any) -> KLController:
    return DecayKLController(cfg.coef, cfg.half_life)
