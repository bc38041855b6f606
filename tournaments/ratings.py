"""Ratings: online OpenSkill and Elo per env, Bradley-Terry fitted on the full win/draw matrix.

- :class:`OpenSkillRatings` (Weng & Lin 2011 via the ``openskill`` library; Plackett-Luce by
  default): Bayesian (mu, sigma) per player, updated after every match; the leaderboard shows the
  conservative rating mu - 3 sigma (TrueSkill convention: 99.7% sure the skill is above it).
- :class:`EloRatings` (Elo 1978): R_a += K (S_a - E_a), E_a = 1 / (1 + 10^((R_b - R_a) / 400)).
- :func:`fit_bradley_terry` (Bradley & Terry 1952; Hunter 2004): P[i beats j] = sigma(t_i - t_j),
  maximum likelihood on the whole matrix, **draws count as half a win for each side** (the
  chess convention; it keeps the model one parameter per player, unlike Davidson 1970's tie
  parameter), confidence intervals from the observed Fisher information.

N-player results (a match has one player per seat; a higher score ranks better, equal scores
tie): OpenSkill rates them natively, one team per player with ranks from the scores. Elo and
Bradley-Terry use the standard pairwise decomposition: the result counts as one game between
every two players, won by the higher score, drawn on equal scores (N(N-1)/2 games; for two
players the usual single game). Elo scales K by 1/(N-1) so one match moves a rating by at most
K, as a two-player game does (Kerrigan's "simple multiplayer Elo"). The pairwise games of one
match are not independent, so Bradley-Terry's intervals are somewhat too narrow for N > 2.

Online ratings are kept per env and pooled under :data:`ALL`. Every rating object serializes with
``state_dict``/``load_state_dict`` for resume. A rating identity holding several seats of one
match (mirror self-play, the same snapshot drawn for two seats) counts once, with its mean score
over those seats (:func:`rated_view`); a match with fewer than two identities (mirror self-play
of two seats, a one-player task) carries no rating information and is skipped. Such matches are
still recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Iterable, Sequence

import numpy as np
import openskill.models

from agentrt.tournaments.types import MatchResult, TournamentError

ALL = "*"  # pseudo-env under which every match is also rated
OPENSKILL_MODELS = {"plackett_luce": "PlackettLuce", "bradley_terry_full": "BradleyTerryFull",
                    "bradley_terry_part": "BradleyTerryPart",
                    "thurstone_mosteller_full": "ThurstoneMostellerFull",
                    "thurstone_mosteller_part": "ThurstoneMostellerPart"}
ELO_PER_NATURAL_UNIT = 400.0 / math.log(10.0)  # Elo points per unit of BT log-odds


def ranks_from_scores(scores: Sequence[float]) -> list[int]:
    """Rank per seat, 0 best; equal scores share a rank (a draw)."""
    return [sum(1 for t in scores if t > s) for s in scores]


def rated_view(result: MatchResult) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """Distinct rating identities of a match (first-seat order) and each one's score: its mean
    over the seats it holds. Fewer than two identities means nothing to rate."""
    keys = result.match.keys
    if len(set(keys)) == len(keys):
        return keys, tuple(float(s) for s in result.scores)
    seats: dict[str, list[float]] = {}
    for k, s in zip(keys, result.scores):
        seats.setdefault(k, []).append(float(s))
    return tuple(seats), tuple(sum(v) / len(v) for v in seats.values())


def pair_score(mine: float, theirs: float) -> float:
    """One pairwise game of an N-player result: 1 win, 0.5 draw, 0 loss by the two scores."""
    return 1.0 if mine > theirs else 0.5 if mine == theirs else 0.0


@dataclass(frozen=True)
class RatingRow:
    """One line of a leaderboard (units: the rating system's own, e.g. OpenSkill mu ~ 25)."""

    key: str
    rating: float  # conservative for OpenSkill (mu - 3 sigma), the rating itself for Elo
    mu: float
    sigma: float
    games: int


class OpenSkillRatings:
    """Online OpenSkill ratings per env (and pooled under ``"*"``).

    Args:
        model: One of :data:`OPENSKILL_MODELS` (default "plackett_luce").
    """

    def __init__(self, model: str = "plackett_luce") -> None:
        if model not in OPENSKILL_MODELS:
            raise TournamentError(
                f"unknown openskill model {model!r}; valid: {', '.join(OPENSKILL_MODELS)}"
            )
        self.model_name = model
        self.model = getattr(openskill.models, OPENSKILL_MODELS[model])()
        self._table: dict[str, dict[str, list[float]]] = {}  # env -> key -> [mu, sigma, games]

    def update(self, result: MatchResult) -> None:
        """Rates one match in its env and in ``"*"``: one team per player, ranked by score
        (equal scores: equal ranks)."""
        keys, scores = rated_view(result)
        if len(keys) < 2:
            return
        ranks = ranks_from_scores(scores)
        for env in (result.match.env, ALL):
            table = self._table.setdefault(env, {})
            rows = [table.setdefault(k, [self.model.mu, self.model.sigma, 0]) for k in keys]
            teams = [[self.model.rating(mu=r[0], sigma=r[1])] for r in rows]
            new = self.model.rate(teams, ranks=ranks)
            for row, team in zip(rows, new):
                row[0], row[1], row[2] = team[0].mu, team[0].sigma, row[2] + 1

    def rating(self, key: str, env: str = ALL) -> tuple[float, float]:
        """(mu, sigma) of ``key`` in ``env``; the prior (25, 25/3) when unrated."""
        mu, sigma, _ = self._table.get(env, {}).get(key, [self.model.mu, self.model.sigma, 0])
        return mu, sigma

    def leaderboard(self, env: str = ALL) -> list[RatingRow]:
        """Rows sorted by conservative rating mu - 3 sigma, best first."""
        rows = [RatingRow(k, mu - 3.0 * sigma, mu, sigma, int(g))
                for k, (mu, sigma, g) in self._table.get(env, {}).items()]
        return sorted(rows, key=lambda r: (-r.rating, r.key))

    def envs(self) -> list[str]:
        return sorted(self._table)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model_name, "table": self._table}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["model"] != self.model_name:
            raise TournamentError(f"saved ratings use model {state['model']!r}, "
                                  f"not the configured {self.model_name!r}")
        self._table = {e: {k: list(v) for k, v in t.items()} for e, t in state["table"].items()}


class EloRatings:
    """Online Elo per env (and pooled under ``"*"``).

    An N-player match updates every pair (see the module docstring): player i moves by
    K / (N - 1) * sum_j (S_ij - E_ij) over the N - 1 others, S_ij = 1, 0.5 or 0 by the scores.

    Args:
        k: Step size K in Elo points per game.
        initial: Rating of a new player.
    """

    def __init__(self, k: float = 16.0, initial: float = 1000.0) -> None:
        self.k, self.initial = k, initial
        self._table: dict[str, dict[str, list[float]]] = {}  # env -> key -> [rating, games]

    def update(self, result: MatchResult) -> None:
        keys, scores = rated_view(result)
        if len(keys) < 2:
            return
        k = self.k / (len(keys) - 1)
        for env in (result.match.env, ALL):
            table = self._table.setdefault(env, {})
            rows = [table.setdefault(k, [self.initial, 0]) for k in keys]
            old = [r[0] for r in rows]
            for i, row in enumerate(rows):
                for j in range(len(rows)):
                    if i == j:
                        continue
                    expected = 1.0 / (1.0 + 10.0 ** ((old[j] - old[i]) / 400.0))
                    row[0] += k * (pair_score(scores[i], scores[j]) - expected)
                row[1] += 1

    def rating(self, key: str, env: str = ALL) -> float:
        return self._table.get(env, {}).get(key, [self.initial, 0])[0]

    def leaderboard(self, env: str = ALL) -> list[RatingRow]:
        rows = [RatingRow(k, r, r, 0.0, int(g)) for k, (r, g) in self._table.get(env, {}).items()]
        return sorted(rows, key=lambda r: (-r.rating, r.key))

    def state_dict(self) -> dict[str, Any]:
        return {"k": self.k, "initial": self.initial, "table": self._table}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.k, self.initial = state["k"], state["initial"]
        self._table = {e: {k: list(v) for k, v in t.items()} for e, t in state["table"].items()}


@dataclass
class WinMatrix:
    """Pairwise results. ``wins[i, j]``: games i won against j; ``draws`` is symmetric.

    Shapes: both [N, N] float arrays indexed like ``names``.
    """

    names: list[str]
    wins: np.ndarray
    draws: np.ndarray

    @classmethod
    def from_results(cls, results: Iterable[MatchResult], names: Sequence[str] | None = None
                     ) -> WinMatrix:
        """Counts every pair of players of every rated result (pairwise decomposition of
        N-player results; see :func:`rated_view` for identities holding several seats)."""
        views = [v for v in map(rated_view, results) if len(v[0]) > 1]
        if names is None:
            names = sorted({k for keys, _ in views for k in keys})
        index = {n: i for i, n in enumerate(names)}
        wins = np.zeros((len(names), len(names)))
        draws = np.zeros_like(wins)
        for keys, s in views:
            for a in range(len(keys)):
                for b in range(a + 1, len(keys)):
                    i, j = index[keys[a]], index[keys[b]]
                    if s[a] == s[b]:
                        draws[i, j] += 1
                        draws[j, i] += 1
                    elif s[a] > s[b]:
                        wins[i, j] += 1
                    else:
                        wins[j, i] += 1
        return cls(list(names), wins, draws)

    @property
    def games(self) -> np.ndarray:
        """[N, N] games played between i and j."""
        return self.wins + self.wins.T + self.draws

    def payoff(self) -> np.ndarray:
        """[N, N] score of i against j in [0, 1] (draws half); NaN where they never met."""
        games = self.games
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(games > 0, (self.wins + 0.5 * self.draws) / games, np.nan)


@dataclass
class BTFit:
    """A fitted Bradley-Terry model.

    Attributes:
        names: Player keys, [N].
        strength: [N] log-odds strengths t_i (natural units), centred to mean 0, or relative to
            the anchor player when one was given.
        se: [N] standard errors of ``strength``.
        lower, upper: [N] confidence bounds at ``level``.
        cov: [N, N] covariance of the centred strengths (inverse observed Fisher information
            projected on sum(t) = 0).
        level: Confidence level of the bounds.
    """

    names: list[str]
    strength: np.ndarray
    se: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    cov: np.ndarray
    level: float

    def elo(self) -> np.ndarray:
        """Strengths on the Elo scale (400 / ln 10 points per log-odds unit)."""
        return self.strength * ELO_PER_NATURAL_UNIT


def fit_bradley_terry(matrix: WinMatrix, prior_sd: float = 10.0, anchor: str | None = None,
                      level: float = 0.95, max_iter: int = 100) -> BTFit:
    """Maximum-likelihood Bradley-Terry strengths with Wald confidence intervals.

    Log-likelihood: sum_{i,j} S_ij log sigma(t_i - t_j), S_ij = wins_ij + draws_ij / 2. A weak
    Gaussian prior t ~ N(0, prior_sd^2) keeps the estimate finite when a player won or lost every
    game (it moves well-measured strengths by a negligible amount). Solved by Newton's method; the
    covariance is the inverse of the negative Hessian, projected on sum(t) = 0 (the model only
    identifies differences).

    Args:
        matrix: The full win/draw matrix.
        prior_sd: Standard deviation of the prior, in log-odds units.
        anchor: Report strengths relative to this player (its strength and SE become 0).
        level: Two-sided confidence level of ``lower``/``upper``.

    Returns:
        A :class:`BTFit`.
    """
    n = len(matrix.names)
    if n < 2:
        raise TournamentError("Bradley-Terry needs results between at least two players")
    score = matrix.wins + 0.5 * matrix.draws
    games = matrix.games
    theta = np.zeros(n)
    prec = 1.0 / prior_sd**2
    for _ in range(max_iter):
        grad, neg_hess = _bt_derivatives(theta, score, games, prec)
        step = np.linalg.solve(neg_hess, grad)
        theta = theta + step
        if np.max(np.abs(step)) < 1e-10:
            break
    theta -= theta.mean()
    _, neg_hess = _bt_derivatives(theta, score, games, prec)
    center = np.eye(n) - 1.0 / n
    cov = center @ np.linalg.inv(neg_hess) @ center
    if anchor is not None:
        if anchor not in matrix.names:
            raise TournamentError(f"anchor {anchor!r} is not a player; players: {matrix.names}")
        a = matrix.names.index(anchor)
        theta = theta - theta[a]
        var = np.diag(cov) + cov[a, a] - 2.0 * cov[:, a]
    else:
        var = np.diag(cov)
    se = np.sqrt(np.clip(var, 0.0, None))
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    return BTFit(list(matrix.names), theta, se, theta - z * se, theta + z * se, cov, level)


def _bt_derivatives(theta: np.ndarray, score: np.ndarray, games: np.ndarray, prec: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and negative Hessian of the penalized BT log-likelihood (Hunter 2004, eq. 2)."""
    diff = theta[:, None] - theta[None, :]
    p = 1.0 / (1.0 + np.exp(-diff))  # p[i, j] = P[i beats j]
    grad = (score - games * p).sum(axis=1) - prec * theta
    w = games * p * (1.0 - p)  # Fisher information of each pair
    neg_hess = np.diag(w.sum(axis=1)) - w + prec * np.eye(len(theta))
    return grad, neg_hess


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b between two score vectors (Kendall 1945; ties handled)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape or a.size < 2:
        raise TournamentError("kendall_tau needs two equally long sequences of length >= 2")
    iu = np.triu_indices(a.size, k=1)
    da = np.sign(a[:, None] - a[None, :])[iu]
    db = np.sign(b[:, None] - b[None, :])[iu]
    denom = math.sqrt(float(np.count_nonzero(da)) * float(np.count_nonzero(db)))
    return float((da * db).sum() / denom) if denom > 0 else 0.0
