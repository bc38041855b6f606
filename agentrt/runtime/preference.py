"""Preference post-training: data, pairs, and the preference step of a policy's objective.

A policy with ``algorithm: dpo | ipo | kto | listwise`` trains through the controller loop like
every policy (:mod:`agentrt.controller.objectives`): one step draws examples, computes the
policy's summed response log-probs, applies the configured loss from ``algos.PREFERENCE_LOSSES``
against reference log-probs, and takes one optimizer step (``Learner.preference_update``:
micro-batches, data-parallel shares and non-finite steps as in RL).

- Offline (``data.path``): rows are read from JSONL, Parquet or a ``datasets`` folder, tokenized
  once (bos + prompt, response + eos, loss only on response tokens) and their reference
  log-probs computed once, by the policy as it stands when preference training starts (after the
  SFT warm start); they travel in the checkpoint, so no reference model is kept in memory.
- Online (``algorithm.online: true``): each step samples ``train.group_size`` responses per task
  prompt, ranks them with the reward and pairs the best with the worst (ties skipped); the
  reference is a frozen snapshot of the starting policy (``Learner.reference``).
- Tournaments: :func:`tournament_pairs` pairs the winner's and the loser's turns at matched
  positions (``objectives.outcome_pairs`` adds the policy's won vs lost games).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from agentrt.algos.preference import PreferenceIndex, sequence_logps
from agentrt.algos.preference import TIE
from agentrt.runtime.learner import Learner
from agentrt.runtime.steps import chunks
from agentrt.core.types import TrainBatch, Trajectory, Turn, collate

log = logging.getLogger(__name__)


@dataclass
class PreferenceExample:
    """One preference example: responses (each with its own prompt ids), ranks, labels.

    Attributes:
        prompt: The prompt text ('' when built from token ids only).
        prompts: Prompt token ids of each response (the same list for data rows).
        responses: Response token ids of each response, eos included.
        ranks: 0 is best; a pairwise row is [0, 1].
        desirable: KTO labels per response, or None to derive them from the ranks.
        ref_logps: Summed reference log-prob of each response, filled before training.
    """

    prompt: str
    prompts: list[list[int]]
    responses: list[list[int]]
    ranks: list[int]
    desirable: list[float] | None = None
    ref_logps: list[float] | None = field(default=None, repr=False)


# ---------------------------------------------------------------------------------- batches
@dataclass
class PreferenceBatch:
    """N response sequences forming G examples; what ``Learner.optimize`` steps on.

    ``size`` and ``select`` count examples, and ``loss_mask`` [G, K] marks each example's
    responses, so optimize's normalisers are (responses, examples) and micro-batches never split
    an example.
    """

    seqs: TrainBatch
    ref_logps: torch.Tensor
    index: PreferenceIndex

    @property
    def size(self) -> int:
        return self.index.num_groups

    @property
    def loss_mask(self) -> torch.Tensor:
        sizes = torch.bincount(self.index.group, minlength=self.size)
        width = int(sizes.max()) if sizes.numel() else 0
        return (torch.arange(width)[None, :] < sizes[:, None]).float()

    def select(self, part: slice | torch.Tensor | list[int]) -> PreferenceBatch:
        groups = list(range(self.size))[part] if isinstance(part, slice) else [
            int(g) for g in part]
        rows, index = self.index.rows_of(groups)
        return PreferenceBatch(self.seqs.select(rows), self.ref_logps[rows], index)

    def to(self, device: torch.device) -> PreferenceBatch:
        """The sequences on ``device`` (losses are reduced on the CPU)."""
        return PreferenceBatch(self.seqs.to(device), self.ref_logps, self.index)


def make_batch(examples: list[PreferenceExample], pad_id: int, pairs: str = "all"
               ) -> PreferenceBatch:
    """Collates examples (token-exact, loss only on response tokens) with their index."""
    trajs = [Trajectory([Turn(p, r, [0.0] * len(r))])
             for ex in examples for p, r in zip(ex.prompts, ex.responses)]
    labels = None if all(ex.desirable is None for ex in examples) else [
        ex.desirable if ex.desirable is not None else [float(k == min(ex.ranks)) for k in ex.ranks]
        for ex in examples]
    index = PreferenceIndex.build([ex.ranks for ex in examples], labels, pairs)
    ref = [v for ex in examples for v in (ex.ref_logps or [0.0] * len(ex.responses))]
    return PreferenceBatch(collate(trajs, pad_id), torch.tensor(ref), index)


def response_logps(learner: Learner, examples: list[PreferenceExample],
                   reference: bool = False, chunk: int = 256) -> list[list[float]]:
    """Summed log-probs [per example][per response] under the policy (or its reference), at
    temperature 1. Examples go through in chunks of ``chunk`` to bound padding."""
    out: list[list[float]] = []
    for part in chunks(len(examples), chunk):
        batch = make_batch(examples[part], learner.pad_id)
        flat = sequence_logps(learner.logprobs(batch.seqs, reference=reference, scaled=False),
                              batch.seqs.loss_mask).tolist()
        for ex in examples[part]:
            out.append(flat[:len(ex.responses)])
            flat = flat[len(ex.responses):]
    return out


def fill_reference(learner: Learner, examples: list[PreferenceExample],
                   reference: bool = False) -> None:
    """Sets ``ref_logps`` of each example (``reference=False``: the policy as it stands now)."""
    for ex, lps in zip(examples, response_logps(learner, examples, reference)):
        ex.ref_logps = lps


def preference_eval(learner: Learner, examples: list[PreferenceExample]) -> dict[str, float]:
    """Held-out pairs: implicit-reward accuracy (ties half), margin, and how often the policy
    alone gives the chosen response the higher likelihood."""
    if not examples:
        return {}
    policy = response_logps(learner, examples)
    correct = likelihood = margin = n = 0.0
    for ex, lps in zip(examples, policy):
        assert ex.ref_logps is not None
        r = [p - q for p, q in zip(lps, ex.ref_logps)]
        for i, ri in enumerate(ex.ranks):
            for j, rj in enumerate(ex.ranks):
                if ri < rj:
                    d = r[i] - r[j]
                    tie = abs(learner.algo.beta * d) <= TIE
                    correct += 0.5 if tie else 1.0 if d > 0 else 0.0
                    likelihood += float(lps[i] > lps[j])
                    margin += learner.algo.beta * d
                    n += 1
    if not n:
        return {}
    return {"eval/pref_accuracy": correct / n, "eval/pref_margin": margin / n,
            "eval/pref_likelihood_accuracy": likelihood / n}


# ---------------------------------------------------------------------------------- online pairs
def best_worst_pairs(trajectories: list[Trajectory]) -> list[PreferenceExample]:
    """Per group (same prompt): the highest- against the lowest-reward response; a group whose
    rewards all tie gives no pair. Token ids are the rollout's own."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t)
    out = []
    for trajs in groups.values():
        best = max(trajs, key=lambda t: t.reward)
        worst = min(trajs, key=lambda t: t.reward)
        if best.reward > worst.reward:
            out.append(pair_turns(best.turns[-1], worst.turns[-1]))
    return out


def pair_turns(chosen: Turn, rejected: Turn) -> PreferenceExample:
    """A pair of two generated turns, each with its own prompt ids (chosen first)."""
    return PreferenceExample("", [chosen.prompt_ids, rejected.prompt_ids],
                             [chosen.response_ids, rejected.response_ids], [0, 1])


def tournament_pairs(trajectories: list[Trajectory], policy_id: str | None = None,
                     same_prompt: bool = False) -> list[PreferenceExample]:
    """DPO pairs from matches: in each episode, turn k of the winner (highest ``outcome``) is
    chosen over turn k of the loser (lowest), for k up to the shorter of the two.

    Each side keeps its own prompt ids (the implicit reward of a response is conditioned on its
    own context); ``same_prompt=True`` keeps only positions whose prompts are identical (mirror
    matches). Draws and episodes without outcomes give no pairs. With ``policy_id``, a pair is
    kept when at least one of its two turns was generated by that policy.
    """
    episodes: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        if t.outcome is not None:
            episodes.setdefault(t.episode_id, []).append(t)
    out = []
    for trajs in episodes.values():
        winner = max(trajs, key=lambda t: t.outcome)
        loser = min(trajs, key=lambda t: t.outcome)
        if winner.outcome == loser.outcome:
            continue
        for w, lo in zip(winner.turns, loser.turns):
            if not w.response_ids or not lo.response_ids or w.response_ids == lo.response_ids and \
                    w.prompt_ids == lo.prompt_ids:
                continue
            if same_prompt and w.prompt_ids != lo.prompt_ids:
                continue
            if policy_id is not None and policy_id not in (w.policy_id, lo.policy_id):
                continue
            out.append(pair_turns(w, lo))
    return out
