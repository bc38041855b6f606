"""Drift detection on rollouts: a run whose outputs change under it is flagged, and acted on.

Configured by ``drift:`` in every run config (:class:`DriftConfig`, off by default). The monitor
lives in the one controller loop (:mod:`agentrt.controller.loop`), so it watches every workload that
plays episodes (``agentrt train``, tournaments, the decomposer); it reads the trajectories of the
run's *learning* policies each step. Four signals, each a number per sample (trajectory):

- ``response_length``: generated tokens (all turns).
- ``token_entropy``: mean surprisal ``-log p`` of the sampled tokens under the sampling
  distribution (the rollout's log-probs, temperature applied). Its expectation is the per-token
  entropy, so this is an unbiased per-sample *estimate* from the sampled tokens; rollouts keep no
  logits, so the exact entropy is not available without a second forward pass.
- ``topic``: the response's embedding (a project embedder of :mod:`agentrt.memory.embedders`,
  ``minilm`` by default); the statistic is the cosine distance between the recent window's
  centroid and the reference's.
- ``reward``: the trajectory's reward.

Each step the **recent window** (the last ``window_steps`` steps' samples) is compared with the
**reference window** of ``reference_steps`` steps: by default (``reference: trailing``) the steps
just before the recent window, so the slow change of a policy that learns is not drift but a
sudden one is; or (``fixed``) the first steps after ``warmup_steps``. Either starts over at the
last accepted change (a resume after a drift pause). The signal's test: ``psi`` (population
stability index over the reference's quantile bins, flagged above ``threshold``), ``ks``
(two-sample Kolmogorov-Smirnov, flagged when p < ``alpha``) or, for the topic, ``centroid`` (the
centroid distance against a block bootstrap of the reference's own, flagged when p < ``alpha``),
each with an effect size on top (``min_change``: the mean moved by more than that fraction, or
the centroids that far apart), since a learning policy's own excursions are real, significant
shifts over windows of hundreds of samples.
``patience`` flagged steps in a row make an **alert**: metrics ``drift/<signal>/stat`` and
``drift/<signal>/alert`` every step, and for an alert one JSON line in ``<run_dir>/drift.jsonl``
and one warning line. Then the **action** (docs/drift.md):

- ``log``: nothing more.
- ``pause``: a checkpoint of this step is written and the run stops (one line, exit code 2);
  running the same command again resumes and accepts the change (a new reference is taken).
- ``rollback``: the policies (weights, optimizer, snapshots) and the workload's state go back to
  the newest checkpoint written with no flag open from before the first flagged window (such
  checkpoints are kept from pruning while an alert may need them, and one rolled back to for
  good); the step count goes on, and so does sampling (fresh samples).
- ``retrain``: as rollback, and the step count goes back too: the steps since that checkpoint
  are trained again (metrics.jsonl loses their rows; drift.jsonl keeps the events).

After ``max_actions`` rollbacks or retrains, the next alert pauses: the cause did not go away.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from collections import deque
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from agentrt.config.drift import DriftConfig, SignalTest
from agentrt.core.errors import AgentrtError

log = logging.getLogger(__name__)

EVENTS = "drift.jsonl"


class DriftPaused(AgentrtError):
    """The drift action ``pause`` stopped the run; its checkpoint of this step is kept."""


# ---------------------------------------------------------------------- tests
def psi(reference: np.ndarray, current: np.ndarray, bins: int = 10) -> float:
    """Population stability index of ``current`` against ``reference`` (1-d samples).

    Bins: the reference's distinct quantiles at ``k / bins`` (so discrete values with ties give
    fewer, wider bins), plus one bin below its minimum and one above its maximum, so a shift to
    values never seen counts. Half a count is added to every bin (no log of zero).
    ``PSI = sum_b (p_cur - p_ref) * ln(p_cur / p_ref)``.
    """
    edges = np.unique(np.quantile(reference, np.linspace(0.0, 1.0, bins + 1)))

    def shares(x: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(edges, x, side="right")  # 0 below the minimum
        idx = np.where(x > edges[-1], len(edges) + 1, idx)  # the maximum keeps its own bin
        counts = np.bincount(idx, minlength=len(edges) + 2) + 0.5
        return counts / counts.sum()

    p_ref, p_cur = shares(reference), shares(current)
    return float(np.sum((p_cur - p_ref) * np.log(p_cur / p_ref)))


def ks_2samp(reference: np.ndarray, current: np.ndarray) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov: (D, asymptotic p-value).

    ``D = max |F_ref - F_cur|``; p from the Kolmogorov distribution at
    ``(sqrt(ne) + 0.12 + 0.11 / sqrt(ne)) * D``, ``ne = n m / (n + m)`` (Numerical Recipes
    14.3). With ties (integer data) the p-value is conservative.
    """
    a, b = np.sort(reference), np.sort(current)
    grid = np.concatenate([a, b])
    d = float(np.max(np.abs(np.searchsorted(a, grid, side="right") / len(a)
                            - np.searchsorted(b, grid, side="right") / len(b))))
    en = math.sqrt(len(a) * len(b) / (len(a) + len(b)))
    lam = (en + 0.12 + 0.11 / en) * d
    if lam < 0.2:
        return d, 1.0
    p = 2.0 * sum((-1) ** (k - 1) * math.exp(-2.0 * k * k * lam * lam) for k in range(1, 101))
    return d, float(min(1.0, max(0.0, p)))


def compare(test: SignalTest, reference: np.ndarray, current: np.ndarray
            ) -> tuple[float, bool]:
    """(statistic, flagged) of one signal: PSI or the KS distance D; flagged only if the mean
    moved by more than ``min_change`` of the reference's too."""
    ref_mean = float(np.mean(reference))
    moved = (test.min_change == 0.0
             or abs(float(np.mean(current)) - ref_mean) > test.min_change * abs(ref_mean))
    if test.test == "psi":
        stat = psi(reference, current, test.bins)
        return stat, moved and stat > test.threshold
    d, p = ks_2samp(reference, current)
    return d, moved and p < test.alpha


# ---------------------------------------------------------------------- samples
def samples(trajectories: Sequence[Any], signals: Sequence[str],
            decode: Callable[[str, list[int]], str], embed: Callable[[list[str]], np.ndarray]
            ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Per-trajectory values of the non-topic signals, and the responses' embeddings [n, d]
    (None when ``topic`` is not watched). ``decode(policy_id, ids)`` gives a response's text."""
    out: dict[str, np.ndarray] = {}
    if "response_length" in signals:
        out["response_length"] = np.array(
            [sum(len(t.response_ids) for t in tr.turns) for tr in trajectories], float)
    if "token_entropy" in signals:
        lps = [[lp for t in tr.turns for lp in t.logprobs] for tr in trajectories]
        out["token_entropy"] = np.array([-float(np.mean(x)) for x in lps if x], float)
    if "reward" in signals:
        out["reward"] = np.array([tr.reward for tr in trajectories], float)
    emb = None
    if "topic" in signals:
        texts = [" ".join(decode(tr.policy_id, t.response_ids) for t in tr.turns)
                 for tr in trajectories]
        emb = np.asarray(embed(texts), np.float32)
    return out, emb


def _unit(v: np.ndarray) -> np.ndarray:
    return v / max(float(np.linalg.norm(v)), 1e-12)


def weights_sha256(weights: dict[str, Any]) -> str:
    """A fingerprint of a policy's weights (name -> tensor): sha256 over names and bytes."""
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(weights[name].detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _shared_embedder(name: str) -> Any:
    """One embedder per name and process: monitors of several runs load the model once."""
    from agentrt.memory.embedders import build_embedder

    return build_embedder(name)


# ---------------------------------------------------------------------- the monitor
class DriftMonitor:
    """Applies :class:`DriftConfig` to each step's trajectories (see the module docstring).

    Each observed step is an entry ``{"step", <signal>: [values], "emb": [n, d] or None}``; the
    last ``window_steps`` entries are the recent window, the ones before it the reference.

    Args:
        cfg: The ``drift:`` section.
        run_dir: Folder of ``drift.jsonl``.
        decode: ``decode(policy_id, ids) -> text`` (the topic signal).
    """

    def __init__(self, cfg: DriftConfig, run_dir: Path,
                 decode: Callable[[str, list[int]], str]) -> None:
        self.cfg = cfg
        self.events = Path(run_dir) / EVENTS
        self.decode = decode
        self._embedder: Any = None
        self.alert: dict[str, Any] | None = None  # the alert of the last observed step
        self.clean: list[int] = []  # steps of checkpoints written with no flag open (kept)
        self.kept: list[int] = []  # checkpoints rolled back to: named in events, never pruned
        self.actions = 0
        self.paused = False
        self._restart()
        self.seen = 0  # (a restart later takes no warm-up again)

    def _restart(self, keep: list[dict[str, Any]] = ()) -> None:
        """A new reference window (the entries ``keep`` stay in it) and no open flags."""
        self.seen = len(keep) + self.cfg.warmup_steps  # warm-up steps are not taken again
        self.reference: deque[dict[str, Any]] = deque(keep, maxlen=self.cfg.reference_steps)
        self.recent: deque[dict[str, Any]] = deque(maxlen=self.cfg.window_steps)
        self.streak = {s: 0 for s in self.cfg.signals}
        self.since: dict[str, int] = {}

    def _embed(self, texts: list[str]) -> np.ndarray:
        """[len(texts), d], one batch per step (a resumed run embeds exactly as before)."""
        if self._embedder is None:
            self._embedder = _shared_embedder(self.cfg.embedder)
        return self._embedder.encode(texts)

    def _add(self, entry: dict[str, Any]) -> None:
        """Into the recent window; the entry it pushes out joins the reference (a fixed
        reference only until it is full)."""
        if len(self.recent) == self.recent.maxlen:
            old = self.recent.popleft()
            if self.cfg.reference == "trailing" or len(self.reference) < self.cfg.reference_steps:
                self.reference.append(old)
        self.recent.append(entry)

    def _pooled(self, entries: Sequence[dict[str, Any]], sig: str) -> np.ndarray:
        return np.array([x for e in entries for x in e[sig]], float)

    def _topic(self, step: int, draws: int = 1000) -> tuple[float, float, np.ndarray]:
        """(distance, p, the bootstrap's distances) of the topic: the cosine distance between
        the recent window's embedding centroid and the reference's, and its block-bootstrap
        p-value: the share of ``draws`` random sets of ``window_steps`` reference steps (whole
        steps, so a step's prompts stay together) whose centroid is at least as far from the
        other reference steps' centroid. Seeded by ``step``, so a resumed run draws the same."""
        sums = np.stack([e["emb"].sum(0) for e in self.reference])  # [steps, d]
        total = sums.sum(0)
        recent = sum(e["emb"].sum(0) for e in self.recent)
        dist = 1.0 - float(_unit(recent) @ _unit(total))
        rng = np.random.default_rng(step)
        k = min(self.cfg.window_steps, len(sums) - 1)
        picks = np.argsort(rng.random((draws, len(sums))), axis=1)[:, :k]  # k distinct each
        inside = sums[picks].sum(1)  # [draws, d]
        outside = total[None, :] - inside
        cos = (inside * outside).sum(1) / np.maximum(
            np.linalg.norm(inside, axis=1) * np.linalg.norm(outside, axis=1), 1e-12)
        return dist, float((1 + np.sum(1.0 - cos >= dist)) / (1 + draws)), 1.0 - cos

    # ------------------------------------------------------------------ each step
    def observe(self, step: int, trajectories: Sequence[Any]) -> dict[str, float]:
        """Takes one step's trajectories of the learning policies; returns the drift/ metrics
        and sets :attr:`alert` when a signal's flagged steps reach ``patience``."""
        self.alert = None
        if not trajectories:
            return {}
        values, emb = samples(trajectories, list(self.cfg.signals), self.decode, self._embed)
        self.seen += 1
        if self.seen <= self.cfg.warmup_steps:
            return {}
        self._add({"step": step, **{k: v.tolist() for k, v in values.items()}, "emb": emb})
        if len(self.reference) < self.cfg.reference_steps or \
                len(self.recent) < self.cfg.window_steps:
            return {}
        metrics: dict[str, float] = {}
        for sig, test in self.cfg.signals.items():
            if sig == "topic":
                stat, p, ref = self._topic(step)
                flagged, cur = p < test.alpha and stat > test.min_change, np.array([stat])
            else:
                ref, cur = self._pooled(self.reference, sig), self._pooled(self.recent, sig)
                if len(ref) == 0 or len(cur) == 0:
                    continue
                stat, flagged = compare(test, ref, cur)
            self.streak[sig] = self.streak[sig] + 1 if flagged else 0
            if self.streak[sig] == 1:
                self.since[sig] = step
            metrics[f"drift/{sig}/stat"] = stat
            metrics[f"drift/{sig}/alert"] = float(self.streak[sig] >= self.cfg.patience)
            if self.streak[sig] == self.cfg.patience and self.alert is None:
                self.alert = self._alert(step, sig, test, stat, ref, cur)
        return metrics

    def _alert(self, step: int, sig: str, test: SignalTest, stat: float, ref: np.ndarray,
               cur: np.ndarray) -> dict[str, Any]:
        action, target = self.cfg.action, self.target(self.since[sig])
        if action in ("rollback", "retrain") and (self.actions >= self.cfg.max_actions
                                                   or target is None):
            action = "pause"
        limit = (f"> {test.threshold:g}" if test.test == "psi" else f"p < {test.alpha:g}")
        if test.min_change:
            limit += (f", distance > {test.min_change:g}" if test.test == "centroid" else
                      f", mean moved > {test.min_change:.0%}")
        event = {"event": "alert", "step": step, "signal": sig, "test": test.test,
                 "stat": stat, "limit": limit, "since_step": self.since[sig],
                 "reference_mean": float(np.mean(ref)), "recent_mean": float(np.mean(cur)),
                 "action": action, "rollback_to": target}
        self.record(event)
        log.warning("drift: step %d: %s %s %.3g (%s) for %d steps since step %d (mean %.3g -> "
                    "%.3g); action: %s", step, sig, test.test.upper(), stat, limit,
                    self.cfg.patience, self.since[sig], event["reference_mean"],
                    event["recent_mean"], action)
        return event

    def record(self, event: dict[str, Any]) -> None:
        """Appends one event to drift.jsonl."""
        with open(self.events, "a") as f:
            f.write(json.dumps(event) + "\n")

    # ------------------------------------------------------------------ checkpoints
    def saved(self, step: int) -> None:
        """A checkpoint of ``step`` is being written: a rollback target if no flag is open.
        Targets stay until a newer one is older than any window a later alert can blame."""
        if not any(self.streak.values()):
            self.clean.append(step)
        old = [c for c in self.clean if c <= step - self.cfg.window_steps - self.cfg.patience]
        if old:
            self.clean = [c for c in self.clean if c >= old[-1]]

    def pinned(self) -> set[int]:
        """Checkpoint steps pruning must keep (rollback targets, and those rolled back to)."""
        return set(self.clean) | set(self.kept)

    def target(self, since: int) -> int | None:
        """The checkpoint a drift first flagged at step ``since`` rolls back to: the newest
        clean one from before the first step of that window (whose samples were compared)."""
        before = [c for c in self.clean if c <= since - self.cfg.window_steps]
        return before[-1] if before else None

    def acted(self, event: dict[str, Any]) -> None:
        """A rollback or retrain to ``event["checkpoint_step"]`` happened: counts and records
        it; the steps after that checkpoint leave the windows (the undone policy made them)."""
        self.actions += 1
        self.record(event)
        good = event["checkpoint_step"]
        self.kept.append(good)
        kept = list(self.reference) + (list(self.recent) if self.cfg.reference == "trailing"
                                       else [])
        self._restart([e for e in kept if e["step"] <= good])
        self.clean = [c for c in self.clean if c <= good]

    def pause_message(self, alert: dict[str, Any], step: int) -> str:
        self.paused = True
        why = ("" if self.cfg.action == "pause" else f" ({self.actions} of drift.max_actions="
               f"{self.cfg.max_actions} done)" if alert["rollback_to"] is not None else
               " (no checkpoint from before the drift to roll back to)")
        return (f"step {alert['step']}: drift on {alert['signal']} ({alert['test'].upper()} "
                f"{alert['stat']:.3g} {alert['limit']} for {self.cfg.patience} steps since step "
                f"{alert['since_step']}, mean {alert['reference_mean']:.3g} -> "
                f"{alert['recent_mean']:.3g}); paused{why}; the checkpoint of step {step} is "
                f"kept; run the same command again to resume and accept the change (a new "
                f"reference window is taken), see {self.events}")

    def state_dict(self) -> dict[str, Any]:
        import torch

        def plain(e: dict[str, Any]) -> dict[str, Any]:
            return {**e, "emb": None if e["emb"] is None else torch.from_numpy(e["emb"])}

        return {"signals": sorted(self.cfg.signals), "seen": self.seen,
                "reference": [plain(e) for e in self.reference],
                "recent": [plain(e) for e in self.recent], "streak": dict(self.streak),
                "since": dict(self.since), "clean": list(self.clean), "kept": list(self.kept),
                "actions": self.actions, "paused": self.paused}

    def load_state_dict(self, state: dict[str, Any] | None, step: int) -> None:
        """Restores a checkpoint's monitor (of ``step``); one taken with other signals (or
        none), or at a pause (resuming accepts the change), starts a new reference window."""
        if state is None:
            return
        self.clean, self.kept = list(state["clean"]), list(state["kept"])
        self.actions = int(state["actions"])
        if state["signals"] != sorted(self.cfg.signals) or state["paused"]:
            if state["paused"]:
                self.record({"event": "accepted", "step": step, "note": "resumed after a "
                             "pause: a new reference window is taken"})
            return

        def arrays(e: dict[str, Any]) -> dict[str, Any]:
            return {**e, "emb": None if e["emb"] is None else e["emb"].numpy()}

        self.seen = int(state["seen"])
        self.reference.extend(arrays(e) for e in state["reference"])
        self.recent.extend(arrays(e) for e in state["recent"])
        self.streak, self.since = dict(state["streak"]), dict(state["since"])
