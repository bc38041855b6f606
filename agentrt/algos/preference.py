"""Preference losses (DPO, IPO, conservative DPO, Plackett-Luce listwise, KTO) in one registry.

One signature for every loss::

    PREFERENCE_LOSSES[name](policy_logps [N], ref_logps [N], index: PreferenceIndex, cfg)
        -> (loss [G], metrics)

``policy_logps`` and ``ref_logps`` are *summed* log-probabilities of each of N responses (only
generated tokens, see :func:`sequence_logps`). ``index`` says how the N responses form G
preference examples: which example each response belongs to, its rank inside the example, its
desirability label (KTO), and the (chosen, rejected) pairs that the pairwise losses use. The loss
is one value per example, so callers take the mean over examples (or a micro-batch's share of
the mini-batch mean) whatever the loss: a pair, a ranked list and an unpaired KTO row all fit.
``cfg`` is the policy's ``AlgorithmConfig`` (``beta``, ``label_smoothing``, KTO weights).

Throughout, r = policy_logp - ref_logp is a response's log-ratio and beta * r its implicit reward
(Rafailov et al. 2023, arXiv:2305.18290, eq. 5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

PreferenceLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]
PAIR_MODES = ("all", "best_worst")


def preference_loss(unpaired: bool = False) -> Callable[[PreferenceLoss], PreferenceLoss]:
    """Marks a loss (registered in ``agentrt.algos.PREFERENCE_LOSSES``); ``unpaired=True``:
    it learns from single labelled rows."""

    def wrap(fn: PreferenceLoss) -> PreferenceLoss:
        fn.accepts_unpaired = unpaired  # type: ignore[attr-defined]
        return fn

    return wrap


@dataclass
class PreferenceIndex:
    """How N responses form G preference examples.

    Attributes:
        group: [N] long, the example (0..G-1) each response belongs to.
        rank: [N] long, 0 is the best response of its example; equal ranks tie.
        desirable: [N] float, 1.0 desirable / 0.0 undesirable (KTO's binary signal).
        pairs: [P, 2] long, rows (chosen, rejected) of the same example, chosen ranked higher.
        num_groups: G.
    """

    group: torch.Tensor
    rank: torch.Tensor
    desirable: torch.Tensor
    pairs: torch.Tensor
    num_groups: int

    @classmethod
    def build(cls, ranks: list[list[int]], desirable: list[list[float]] | None = None,
              pairs: str = "all") -> PreferenceIndex:
        """From per-example rank lists (rows are numbered example by example).

        Args:
            ranks: ``ranks[g][k]`` is the rank of response k of example g (0 = best).
            desirable: KTO labels per response; default: the best rank of each example is
                desirable, every other response undesirable.
            pairs: "all" (every pair of differently ranked responses) or "best_worst" (each best
                response against each worst one).
        """
        if pairs not in PAIR_MODES:
            raise KeyError(f"unknown pair mode {pairs!r}; valid: {', '.join(PAIR_MODES)}")
        group, rank, labels, pair_rows = [], [], [], []
        for g, rs in enumerate(ranks):
            start = len(rank)
            group += [g] * len(rs)
            rank += rs
            labels += (desirable[g] if desirable is not None
                       else [float(r == min(rs)) for r in rs])
            for i, ri in enumerate(rs):
                for j, rj in enumerate(rs):
                    keep = ri < rj if pairs == "all" else ri == min(rs) and rj == max(rs) > ri
                    if keep:
                        pair_rows.append((start + i, start + j))
        return cls(
            group=torch.tensor(group, dtype=torch.long),
            rank=torch.tensor(rank, dtype=torch.long),
            desirable=torch.tensor(labels, dtype=torch.float32),
            pairs=torch.tensor(pair_rows, dtype=torch.long).reshape(-1, 2),
            num_groups=len(ranks),
        )

    def rows_of(self, groups: list[int]) -> tuple[list[int], PreferenceIndex]:
        """Rows of ``groups`` (in order) and the index of that sub-batch, renumbered from 0."""
        new_id = {g: i for i, g in enumerate(groups)}
        rows = [n for g in groups for n in (self.group == g).nonzero().flatten().tolist()]
        new_row = {old: i for i, old in enumerate(rows)}
        keep = [p for p in self.pairs.tolist() if p[0] in new_row]
        pairs = torch.tensor([[new_row[c], new_row[r]] for c, r in keep],
                             dtype=torch.long).reshape(-1, 2)
        idx = torch.tensor(rows, dtype=torch.long)
        sub = PreferenceIndex(
            group=torch.tensor([new_id[int(g)] for g in self.group[idx]], dtype=torch.long),
            rank=self.rank[idx], desirable=self.desirable[idx], pairs=pairs,
            num_groups=len(groups))
        return rows, sub


def sequence_logps(token_logps: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Summed log-probs of the generated tokens of each sequence. [N, T], [N, T] -> [N]."""
    return (token_logps * loss_mask).sum(-1)


def group_mean(values: torch.Tensor, groups: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Mean of ``values`` [M] per group id in ``groups`` [M] -> [G] (0 for an empty group)."""
    total = values.new_zeros(num_groups).index_add(0, groups, values)
    count = values.new_zeros(num_groups).index_add(0, groups, torch.ones_like(values))
    return total / count.clamp_min(1.0)


# Implicit-reward differences within this are a tie: the same sequence's log-probs computed in
# different rows (packed with other sequences, agentrt.runtime.packing) differ by float32 rounding.
TIE = 1e-4


def preference_metrics(log_ratio: torch.Tensor, index: PreferenceIndex, beta: float
                       ) -> dict[str, float]:
    """pref/ metrics from log-ratios [N]: implicit rewards, margin, accuracy, log-ratio (KL).

    Accuracy counts a tie (within :data:`TIE`) as half right, so a policy equal to its reference
    scores 0.5.
    ``pref/kl`` is the mean sequence log-ratio log pi/pi_ref: a KL estimate when the responses
    are the policy's own samples (online), the log-ratio on the data otherwise.
    """
    r = (beta * log_ratio).detach()
    out = {"pref/kl": float(log_ratio.detach().mean())}
    if index.pairs.numel():
        rc, rl = r[index.pairs[:, 0]], r[index.pairs[:, 1]]
        out["pref/chosen_reward"] = float(rc.mean())
        out["pref/rejected_reward"] = float(rl.mean())
        out["pref/margin"] = float((rc - rl).mean())
        d = rc - rl
        out["pref/accuracy"] = float(((d > TIE).float() + 0.5 * (d.abs() <= TIE).float()).mean())
    else:
        good = index.desirable > 0
        if good.any():
            out["pref/chosen_reward"] = float(r[good].mean())
        if (~good).any():
            out["pref/rejected_reward"] = float(r[~good].mean())
    return out


def _pair_log_ratios(policy_logps: torch.Tensor, ref_logps: torch.Tensor,
                     index: PreferenceIndex) -> tuple[torch.Tensor, torch.Tensor]:
    """h = r_chosen - r_rejected per pair [P], and the log-ratios r [N]."""
    r = policy_logps - ref_logps
    return r[index.pairs[:, 0]] - r[index.pairs[:, 1]], r


@preference_loss()
def dpo_loss(policy_logps: torch.Tensor, ref_logps: torch.Tensor, index: PreferenceIndex,
             cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO, sigmoid loss (arXiv:2305.18290, eq. 7): -log sigma(beta h), averaged over an
    example's pairs.

    With ``cfg.label_smoothing`` eps > 0 it is conservative DPO (Mitchell 2023, "A note on DPO with
    noisy preferences"): -(1 - eps) log sigma(beta h) - eps log sigma(-beta h).
    """
    h, r = _pair_log_ratios(policy_logps, ref_logps, index)
    eps = cfg.label_smoothing
    pair_loss = -(1.0 - eps) * F.logsigmoid(cfg.beta * h) - eps * F.logsigmoid(-cfg.beta * h)
    loss = group_mean(pair_loss, index.group[index.pairs[:, 0]], index.num_groups)
    return loss, preference_metrics(r, index, cfg.beta)


@preference_loss()
def ipo_loss(policy_logps: torch.Tensor, ref_logps: torch.Tensor, index: PreferenceIndex,
             cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """IPO (Azar et al. 2023, arXiv:2310.12036, eq. 17): (h - 1 / (2 beta))^2 per pair, beta = tau.

    h uses summed log-probs as in the paper (some libraries use per-token means instead).
    """
    h, r = _pair_log_ratios(policy_logps, ref_logps, index)
    pair_loss = (h - 1.0 / (2.0 * cfg.beta)) ** 2
    loss = group_mean(pair_loss, index.group[index.pairs[:, 0]], index.num_groups)
    return loss, preference_metrics(r, index, cfg.beta)


@preference_loss()
def plackett_luce_loss(policy_logps: torch.Tensor, ref_logps: torch.Tensor,
                       index: PreferenceIndex, cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """Plackett-Luce over each example's ranking (arXiv:2305.18290, appendix A.3, eq. 18).

    With the responses ordered best first, tau(1..K), and s = beta r:
    loss = -sum_k [s_tau(k) - log sum_{j >= k} exp(s_tau(j))]. Ties keep the data's order.
    Two responses give exactly the DPO loss.
    """
    r = policy_logps - ref_logps
    s = cfg.beta * r
    g, n = index.num_groups, r.shape[0]
    # Slot of each response in its example's best-first order (stable: ties keep row order).
    order = sorted(range(n), key=lambda i: (int(index.group[i]), int(index.rank[i]), i))
    sizes = torch.bincount(index.group, minlength=g)
    width = int(sizes.max()) if n else 1
    starts = torch.cumsum(sizes, 0) - sizes
    rows = torch.tensor(order, dtype=torch.long)
    grp = index.group[rows]
    slot = torch.arange(n) - starts[grp]
    # Padding at the end of each row holds a very negative finite score (exp -> 0, no NaN).
    scores = s.new_full((g, width), -1e9).index_put((grp, slot), s[rows])
    valid = torch.zeros(g, width, dtype=s.dtype).index_put((grp, slot), torch.ones(n))
    tail_lse = torch.logcumsumexp(scores.flip(-1), dim=-1).flip(-1)  # log sum_{j >= k} exp s_j
    loss = -((scores - tail_lse) * valid).sum(-1)
    return loss, preference_metrics(r, index, cfg.beta)


@preference_loss(unpaired=True)
def kto_loss(policy_logps: torch.Tensor, ref_logps: torch.Tensor, index: PreferenceIndex,
             cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """KTO (Ethayarajh et al. 2024, arXiv:2402.01306, eq. 8), mean over an example's responses.

    desirable: w_D (1 - sigma(beta (r - z0))); undesirable: w_U (1 - sigma(beta (z0 - r))).
    z0, the reference point, is max(0, mean r) over the responses passed in, without gradient:
    the paper estimates the same KL term from mismatched pairs of the micro-batch; we use the
    batch's own log-ratios, which avoids a second forward pass.
    """
    r = policy_logps - ref_logps
    z0 = r.detach().mean().clamp_min(0.0)
    good = index.desirable
    value = good * cfg.kto_desirable_weight * torch.sigmoid(cfg.beta * (r - z0)) + (
        1.0 - good) * cfg.kto_undesirable_weight * torch.sigmoid(cfg.beta * (z0 - r))
    weight = good * cfg.kto_desirable_weight + (1.0 - good) * cfg.kto_undesirable_weight
    loss = group_mean(weight - value, index.group, index.num_groups)
    metrics = preference_metrics(r, index, cfg.beta)
    metrics["pref/kto_z0"] = float(z0)
    return loss, metrics
