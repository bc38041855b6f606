"""Canary statistics: is a candidate version not worse than the incumbent? A group-sequential
one-sided non-inferiority test on a bounded per-sample metric, independent of HTTP, so a server
(agentrt.serving.canary), a league or a training run can use it.

Each sample is a number in ``[low, high]`` (a reward, a win, a user's thumbs-up) from one of two
arms. With ``d = mean(candidate) - mean(incumbent)`` and margin ``m > 0`` the hypotheses are

    H0: d <= -m  (the candidate is worse by the margin or more)   -> roll back
    H1: d >  -m  (the candidate is not worse)                      -> promote

and the statistic at a look is Welch's ``Z = (mean_c - mean_i + m) / sqrt(s_c^2/n_c + s_i^2/n_i)``.
The design is the Pampallona-Tsiatis (1994) family with O'Brien-Fleming-shaped boundaries
(Jennison & Turnbull, *Group Sequential Methods*, 2000, sec. 5.3) and binding futility: at look
``k`` of ``K`` (information fraction ``t = k/K``) promote when ``Z >= C1 t^-1/2``, roll back when
``Z <= (C1 + C2) t^1/2 - C2 t^-1/2``, else collect more. The two boundaries meet at ``t = 1``, so
a decision is certain by the last look. C1 and C2 are solved numerically (recursive integration
of the joint normal law of the Z's, Jennison & Turnbull ch. 19) so that

    P(promote | d = -m) = alpha        P(promote | d = 0) = power

The most samples it can take (both arms together) are ``R * N_fixed``, where
``N_fixed = (z_{1-alpha} + z_power)^2 sigma^2 / (m^2 s (1 - s))`` is the fixed-sample size of the
same test with a share ``s`` of samples from the candidate, ``sigma`` the planning standard
deviation of one sample (default ``(high - low) / 2``, the largest a bounded metric can have) and
``R = ((C1 + C2) / (z_{1-alpha} + z_power))^2`` the inflation factor of the design (1.0 for one
look, about 1.1 for five).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator
from scipy import optimize, stats

from agentrt.core.schema import ConfigModel

Arm = Literal["candidate", "incumbent"]
Action = Literal["promote", "rollback", "continue"]
_GRID = 401  # points per look in the recursive integration (odd: Simpson's rule)


class CanaryTest(ConfigModel):
    """The test's settings (docs/serving.md, Canary)."""

    alpha: float = Field(0.05, gt=0, lt=0.5, description="Chance of promoting a candidate "
                         "worse by the margin (one-sided type I error).")
    power: float = Field(0.9, gt=0.5, lt=1, description="Chance of promoting a candidate "
                         "as good as the incumbent.")
    margin: float = Field(0.05, gt=0, description="Non-inferiority margin m, in metric units.")
    looks: int = Field(5, ge=1, le=20, description="Analyses, at equal steps of the samples.")
    share: float = Field(0.05, gt=0, lt=1, description="Share of samples from the candidate.")
    low: float = Field(0.0, description="Smallest value the metric can take.")
    high: float = Field(1.0, description="Largest value the metric can take.")
    sigma: float | None = Field(None, gt=0, description="Planning standard deviation of one "
                                "sample; null: (high - low) / 2, the largest possible.")

    @model_validator(mode="after")
    def _bounded(self) -> CanaryTest:
        span = self.high - self.low
        if span <= 0:
            raise ValueError(f"high ({self.high}) must be above low ({self.low})")
        if self.margin >= span:
            raise ValueError(f"margin ({self.margin}) must be below high - low ({span:g})")
        if self.sigma is not None and self.sigma > span / 2:
            raise ValueError(f"sigma ({self.sigma}) cannot exceed (high - low) / 2 = "
                             f"{span / 2:g}, the largest a metric in [low, high] has")
        return self

    @property
    def planning_sigma(self) -> float:
        return self.sigma if self.sigma is not None else (self.high - self.low) / 2


@dataclass(frozen=True)
class Design:
    """Boundaries and sample sizes of one :class:`CanaryTest`.

    Attributes:
        promote_at: Z at or above which look k promotes (length ``looks``).
        rollback_at: Z at or below which look k rolls back (equal to ``promote_at`` at the end).
        at_samples: Samples (both arms) at which look k happens; the last is ``max_samples``.
        fixed_samples: N_fixed, the one-look test's sample size (normal approximation).
        inflation: R, max_samples / fixed_samples before rounding up.
    """

    promote_at: tuple[float, ...]
    rollback_at: tuple[float, ...]
    at_samples: tuple[int, ...]
    fixed_samples: float
    inflation: float

    @property
    def max_samples(self) -> int:
        return self.at_samples[-1]


def _simpson(lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    x = np.linspace(lo, hi, _GRID)
    w = np.ones(_GRID)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return x, w * (hi - lo) / (3 * (_GRID - 1))


def crossing(upper: np.ndarray, lower: np.ndarray, info: np.ndarray, theta: float,
             paths: list[tuple[np.ndarray, np.ndarray]] | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """P(stop above ``upper[k]`` at look k) and P(stop below ``lower[k]`` at look k), Z_k being
    the Z statistics of Brownian motion with drift ``theta`` observed at information ``info[k]``
    (score S_k = Z_k sqrt(I_k) has independent N(theta dI, dI) increments). ``paths`` receives,
    per look but the last, the grid of S values that continue and their probability mass."""
    ups, downs = np.zeros(len(info)), np.zeros(len(info))
    grid = weights = dens = prev = None
    for k, (a, b, i) in enumerate(zip(upper, lower, info)):
        hi, lo = a * math.sqrt(i), min(b, a) * math.sqrt(i)  # stop thresholds on the S scale
        if k == 0:
            sd, mean = math.sqrt(i), theta * i
            ups[k] = stats.norm.sf((hi - mean) / sd)
            downs[k] = stats.norm.cdf((lo - mean) / sd)
        else:
            sd = math.sqrt(i - prev)
            mean = grid + theta * (i - prev)  # type: ignore[operator]
            mass = dens * weights  # type: ignore[operator]
            ups[k] = mass @ stats.norm.sf((hi - mean) / sd)
            downs[k] = mass @ stats.norm.cdf((lo - mean) / sd)
        if hi <= lo or k == len(info) - 1:
            break
        new_grid, new_weights = _simpson(lo, hi)
        if k == 0:
            dens = stats.norm.pdf((new_grid - theta * i) / math.sqrt(i)) / math.sqrt(i)
        else:
            kern = stats.norm.pdf((new_grid[:, None] - mean[None, :]) / sd) / sd
            dens = kern @ mass
        grid, weights, prev = new_grid, new_weights, i
        if paths is not None:
            paths.append((grid, dens * weights))
    return ups, downs


def _boundaries(c1: float, c2: float, looks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(upper, lower, information) for drift 1 at the alternative (standardised units)."""
    t = np.arange(1, looks + 1) / looks
    upper = c1 / np.sqrt(t)
    lower = np.minimum((c1 + c2) * np.sqrt(t) - c2 / np.sqrt(t), upper)
    lower[-1] = upper[-1]  # they meet at the end (exactly, not up to rounding)
    return upper, lower, t * (c1 + c2) ** 2


@functools.lru_cache(maxsize=64)
def solve(alpha: float, power: float, looks: int) -> tuple[float, float]:
    """C1, C2 of the design with ``looks`` looks (see the module docstring)."""
    za, zb = stats.norm.isf(alpha), stats.norm.ppf(power)
    if looks == 1:
        return float(za), float(zb)

    def gap(c: np.ndarray) -> list[float]:
        upper, lower, info = _boundaries(c[0], c[1], looks)
        return [crossing(upper, lower, info, 0.0)[0].sum() - alpha,
                crossing(upper, lower, info, 1.0)[1].sum() - (1 - power)]

    c, _, ok, msg = optimize.fsolve(gap, [za * 1.1, zb * 1.1], full_output=True, xtol=1e-10)
    if ok != 1:
        raise RuntimeError(f"the canary design did not solve for alpha {alpha}, power {power}, "
                           f"{looks} looks: {msg}")
    return float(c[0]), float(c[1])


def design(test: CanaryTest) -> Design:
    """The boundaries and sample sizes of ``test``."""
    c1, c2 = solve(test.alpha, test.power, test.looks)
    upper, lower, _ = _boundaries(c1, c2, test.looks)
    z = stats.norm.isf(test.alpha) + stats.norm.ppf(test.power)
    fixed = (z * test.planning_sigma / test.margin) ** 2 / (test.share * (1 - test.share))
    inflation = ((c1 + c2) / z) ** 2
    at = tuple(math.ceil(fixed * inflation * k / test.looks) for k in range(1, test.looks + 1))
    return Design(tuple(upper.tolist()), tuple(lower.tolist()), at, fixed, inflation)


@dataclass
class _Arm:
    """Running count, mean and sum of squared deviations (Welford)."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)

    @property
    def var(self) -> float:
        return self.m2 / (self.n - 1) if self.n > 1 else 0.0


@dataclass
class Decision:
    """One look of the test and its evidence (what the canary log records).

    Attributes:
        decision: promote, rollback or continue.
        look, looks: This look's number (1-based) and the design's last.
        samples, mean, var: Per arm, the samples so far, their mean and sample variance.
        difference: mean(candidate) - mean(incumbent).
        statistic: Z (module docstring).
        promote_at, rollback_at: This look's boundaries.
        p_value: One-sided p-value of H0 in the stagewise ordering (Jennison & Turnbull 8.4):
            the chance under d = -m of promoting at an earlier look or reaching this look with
            a larger Z.
        rule: Which rule fired, in words.
    """

    samples: dict[str, int]
    mean: dict[str, float]
    var: dict[str, float]
    decision: Action
    look: int
    looks: int
    difference: float
    margin: float
    statistic: float
    promote_at: float
    rollback_at: float
    p_value: float
    alpha: float
    rule: str
    extra: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(out.pop("extra"))
        return out


class SequentialTest:
    """Feeds samples of the two arms; returns a :class:`Decision` at each look.

    Args:
        test: The settings.
    """

    def __init__(self, test: CanaryTest) -> None:
        self.test, self.design = test, design(test)
        self.arms = {"candidate": _Arm(), "incumbent": _Arm()}
        self.decisions: list[Decision] = []
        self.final: Decision | None = None

    @property
    def samples(self) -> int:
        return self.arms["candidate"].n + self.arms["incumbent"].n

    def add(self, arm: Arm, value: float) -> Decision | None:
        """Adds one sample (a value in [low, high]); a Decision when this sample is a look's.

        Raises:
            ValueError: a value out of range, an unknown arm, or a test already decided.
        """
        t = self.test
        if self.final is not None:
            raise ValueError(f"the test already decided: {self.final.decision}")
        if arm not in self.arms:
            raise ValueError(f"arm must be candidate or incumbent, not {arm!r}")
        if not (math.isfinite(value) and t.low <= value <= t.high):
            raise ValueError(f"a sample must be a number in [{t.low:g}, {t.high:g}], not {value}")
        self.arms[arm].add(value)
        k = len(self.decisions)
        if self.samples < self.design.at_samples[k] or min(a.n for a in self.arms.values()) < 2:
            return None
        decision = self._look(k)
        self.decisions.append(decision)
        if decision.decision != "continue":
            self.final = decision
        return decision

    def _look(self, k: int) -> Decision:
        t, d = self.test, self.design
        c, i = self.arms["candidate"], self.arms["incumbent"]
        floor = 1e-6 * (t.high - t.low) ** 2  # two constant arms still give a finite Z
        se = math.sqrt(max(c.var, floor) / c.n + max(i.var, floor) / i.n)
        diff = c.mean - i.mean
        z = (diff + t.margin) / se
        up, down = d.promote_at[k], d.rollback_at[k]
        if z >= up:
            action: Action = "promote"
            rule = (f"Z {z:.3f} >= {up:.3f} at look {k + 1}: not worse than the incumbent by "
                    f"{t.margin:g} (H0 d <= -margin rejected at alpha {t.alpha:g})")
        elif z <= down:
            action = "rollback"
            rule = (f"Z {z:.3f} <= {down:.3f} at look {k + 1}: worse than the incumbent ("
                    + ("H0 d <= -margin not rejected at the last look)" if k == t.looks - 1
                       else f"H1 d = 0 rejected at level {1 - t.power:g})"))
        else:
            action = "continue"
            rule = f"{down:.3f} < Z {z:.3f} < {up:.3f} at look {k + 1}: collect more"
        return Decision(samples={"candidate": c.n, "incumbent": i.n},
                        mean={"candidate": c.mean, "incumbent": i.mean},
                        var={"candidate": c.var, "incumbent": i.var}, decision=action,
                        look=k + 1, looks=t.looks, difference=diff, margin=t.margin,
                        statistic=z, promote_at=up, rollback_at=down,
                        p_value=self.p_value(k, z), alpha=t.alpha, rule=rule)

    def p_value(self, k: int, z: float) -> float:
        """Stagewise-ordering p-value of Z = ``z`` at look ``k`` (0-based)."""
        t = self.test
        ups, info, paths = _null_paths(t.alpha, t.power, t.looks)
        if k == 0:
            return float(stats.norm.sf(z))
        grid, mass = paths[k - 1]
        sd = math.sqrt(info[k] - info[k - 1])
        beyond = mass @ stats.norm.sf((z * math.sqrt(info[k]) - grid) / sd)
        return float(min(1.0, ups[:k].sum() + beyond))


@functools.lru_cache(maxsize=64)
def _null_paths(alpha: float, power: float, looks: int
                ) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Under d = -m: each look's promotion chance, the information, the continuing paths."""
    upper, lower, info = _boundaries(*solve(alpha, power, looks), looks)
    paths: list[tuple[np.ndarray, np.ndarray]] = []
    ups, _ = crossing(upper, lower, info, 0.0, paths)
    return ups, info, paths
