"""Preference post-training: data, the offline loop, and pairs built online from rollouts.

``agentrt train`` with ``algorithm: dpo | ipo | kto | listwise`` lands here (Trainer.run
dispatches). One step is: draw examples, compute the policy's summed response log-probs, apply
the configured loss from ``algos.PREFERENCE_LOSSES`` against reference log-probs, and take one
optimizer step through ``HybridEngine.optimize`` (micro-batches, non-finite steps skipped).

- Offline (``data.path``): rows are read from JSONL, Parquet or a ``datasets`` folder, tokenized
  once (bos + prompt, response + eos, loss only on response tokens) and their reference
  log-probs computed once, by the policy as it stands when preference training starts (after the
  SFT warm start); they travel in the checkpoint, so no reference model is kept in memory.
- Online (``algorithm.online: true``): each step samples ``train.group_size`` responses per task
  prompt, ranks them with the reward and pairs the best with the worst (ties skipped); the
  reference is a frozen copy of the starting policy (``engine.needs_reference``).
- Tournaments: :func:`tournament_pairs` pairs the winner's and the loser's turns at matched
  positions; :func:`preference_step` trains on any such examples.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from agentrt.algos import PREFERENCE_LOSSES, PreferenceIndex, sequence_logps
from agentrt.algos.preference import group_mean
from agentrt.config import DataConfig, dump_config
from agentrt.engine import HybridEngine, chunks, shift_logprobs
from agentrt.errors import AgentrtError
from agentrt.plot import plot_metrics
from agentrt.progress import StepProgress
from agentrt.run import load_checkpoint, rng_state, set_rng_state
from agentrt.trainer import PromptSampler, Trainer, encode_prompt, evaluate, rollout
from agentrt.types import TrainBatch, Trajectory, Turn, collate

log = logging.getLogger(__name__)


class DataError(AgentrtError):
    """The preference data cannot be read at all (rows that are merely malformed are skipped)."""


# ---------------------------------------------------------------------------------- data
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


def read_rows(cfg: DataConfig) -> list[Any]:
    """Raw rows of ``cfg.path`` (JSONL lines that are not JSON come back as None)."""
    path = Path(str(cfg.path))
    fmt = cfg.format
    if fmt == "auto":
        fmt = "datasets" if path.is_dir() else "parquet" if path.suffix == ".parquet" else "jsonl"
    try:
        if fmt == "jsonl":
            return [_json_or_none(line) for line in path.read_text().splitlines() if line.strip()]
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        import datasets

        ds = datasets.load_from_disk(str(path))
    except (OSError, ValueError, ImportError) as exc:
        raise DataError(f"data.path {str(path)!r}: cannot read as {fmt} ({exc})") from None
    if isinstance(ds, datasets.DatasetDict):
        split = cfg.split or ("train" if "train" in ds else None)
        if split not in ds:
            raise DataError(f"data.split {split!r} is not in {str(path)!r}; splits: "
                            f"{', '.join(ds)}")
        ds = ds[split]
    return ds.to_list()


def _json_or_none(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def parse_row(row: Any) -> tuple[str, list[str], list[int], list[float] | None] | str:
    """(prompt, responses, ranks, desirable) of a pairwise, listwise or unpaired row, or the
    reason it is malformed. Shapes: {prompt, chosen, rejected}; {prompt, responses, ranks |
    scores} (no ranks/scores: best first); {prompt, response, desirable | label}."""
    if not isinstance(row, dict):
        return "not a JSON object"
    prompt = row.get("prompt")
    if not isinstance(prompt, str):
        return "missing field"
    if "chosen" in row or "rejected" in row:
        texts, ranks, labels = [row.get("chosen"), row.get("rejected")], [0, 1], None
    elif "responses" in row:
        texts, labels = row["responses"], None
        ranks = _ranks(row, len(texts) if isinstance(texts, list) else -1)
        if isinstance(ranks, str):
            return ranks
    elif "response" in row:
        label = row.get("desirable", row.get("label"))
        if not isinstance(label, (bool, int)) or label not in (0, 1):
            return "missing field"
        texts, ranks, labels = [row["response"]], [0], [float(label)]
    else:
        return "missing field"
    if not all(isinstance(t, str) for t in texts):
        return "missing field"
    if any(not t.strip() for t in texts):
        return "empty response"
    if len(set(texts)) < len(texts):
        return "chosen == rejected"
    return prompt, texts, ranks, labels


def _ranks(row: dict[str, Any], n: int) -> list[int] | str:
    if n < 2:
        return "fewer than 2 responses"
    if "ranks" in row or "scores" in row:
        given = row.get("ranks", row.get("scores"))
        if not isinstance(given, list) or len(given) != n or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in given):
            return "ranks/scores do not match responses"
        key = given if "ranks" in row else [-x for x in given]  # higher score = better
        levels = sorted(set(key))
        ranks = [levels.index(x) for x in key]
    else:
        ranks = list(range(n))
    return ranks if len(set(ranks)) > 1 else "all responses tie"


def load_preference_data(cfg: DataConfig, tokenizer: Any, accepts_unpaired: bool,
                         exclude_prompts: set[str] = frozenset()
                         ) -> tuple[list[PreferenceExample], list[PreferenceExample]]:
    """(train, eval) examples of ``cfg.path``, tokenized once; malformed rows are counted,
    skipped and reported in one warning line. Rows whose prompt is in ``exclude_prompts`` (the
    task's held-out prompts) are dropped. The eval split is by prompt hash, so no prompt is in
    both splits."""
    rows = read_rows(cfg)
    skipped: Counter[str] = Counter()
    train, held_out, excluded = [], [], 0
    eos = [tokenizer.eos_token_id]
    for row in rows:
        parsed = parse_row(row)
        if isinstance(parsed, str):
            skipped[parsed] += 1
            continue
        prompt, texts, ranks, labels = parsed
        if labels is not None and not accepts_unpaired:
            skipped["unpaired row (needs algorithm kto)"] += 1
            continue
        if prompt in exclude_prompts:
            excluded += 1
            continue
        p_ids = encode_prompt(tokenizer, prompt)
        r_ids = [tokenizer.encode(t, add_special_tokens=False) + eos for t in texts]
        if len(p_ids) + max(len(r) for r in r_ids) > cfg.max_length:
            skipped["too long"] += 1
            continue
        ex = PreferenceExample(prompt, [p_ids] * len(r_ids), r_ids, ranks, labels)
        is_eval = zlib.crc32(prompt.encode()) % 10_000 < cfg.eval_fraction * 10_000
        (held_out if is_eval else train).append(ex)
    if skipped:
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items()))
        log.warning("preference data %s: skipped %d of %d rows (%s)", cfg.path,
                    sum(skipped.values()), len(rows), detail)
    if excluded:
        log.info("preference data: dropped %d rows whose prompt is a held-out task prompt",
                 excluded)
    if not train:
        raise DataError(f"data.path {cfg.path!r} has no usable training rows "
                        f"(read {len(rows)}, skipped {sum(skipped.values())})")
    return train, held_out


# ---------------------------------------------------------------------------------- batches
@dataclass
class PreferenceBatch:
    """N response sequences forming G examples; what ``HybridEngine.optimize`` steps on.

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


def response_logps(engine: HybridEngine, examples: list[PreferenceExample],
                   reference: bool = False, chunk: int = 256) -> list[list[float]]:
    """Summed log-probs [per example][per response] under the policy (or its reference), at
    temperature 1. Examples go through in chunks of ``chunk`` to bound padding."""
    out: list[list[float]] = []
    for part in chunks(len(examples), chunk):
        batch = make_batch(examples[part], engine.pad_id)
        flat = sequence_logps(engine.logprobs(batch.seqs, reference=reference, scaled=False),
                              batch.seqs.loss_mask).tolist()
        for ex in examples[part]:
            out.append(flat[:len(ex.responses)])
            flat = flat[len(ex.responses):]
    return out


def fill_reference(engine: HybridEngine, examples: list[PreferenceExample],
                   reference: bool = False) -> None:
    """Sets ``ref_logps`` of each example (``reference=False``: the policy as it stands now)."""
    for ex, lps in zip(examples, response_logps(engine, examples, reference)):
        ex.ref_logps = lps


def preference_loss_fn(engine: HybridEngine) -> Callable[..., tuple[torch.Tensor, dict]]:
    """``loss_fn(micro_batch, n_responses, n_examples)`` for ``HybridEngine.optimize``: the
    micro-batch's share of the mean per-example loss of the mini-batch."""
    algo = engine.algo
    loss = PREFERENCE_LOSSES.get(str(algo.preference_loss))

    def loss_fn(mb: PreferenceBatch, n_tok: float, n_seq: float) -> tuple[torch.Tensor, dict]:
        del n_tok
        logits = engine._logits(engine.model, mb.seqs, scaled=False)
        policy = sequence_logps(shift_logprobs(logits, mb.seqs.input_ids), mb.seqs.loss_mask)
        per_example, metrics = loss(policy, mb.ref_logps, mb.index, algo)
        if algo.chosen_nll_coef:  # RPO: keeps the chosen answers likely (arXiv:2404.19733)
            best = mb.index.desirable > 0
            nll = -policy[best] / mb.seqs.loss_mask[best].sum(-1).clamp_min(1.0)
            per_example = per_example + algo.chosen_nll_coef * group_mean(
                nll, mb.index.group[best], mb.index.num_groups)
            metrics["pref/chosen_nll"] = float(nll.detach().mean()) if nll.numel() else 0.0
        return per_example.sum() / n_seq, metrics

    return loss_fn


def preference_step(engine: HybridEngine, examples: list[PreferenceExample], pairs: str = "all"
                    ) -> dict[str, float]:
    """One optimizer step of the policy's preference loss on ``examples``.

    Examples without ``ref_logps`` get them from the engine's reference model first (online and
    tournament pairs). Steps the LR schedule and bumps ``engine.version``.
    """
    missing = [ex for ex in examples if ex.ref_logps is None]
    if missing:
        fill_reference(engine, missing, reference=True)
    batch = make_batch(examples, engine.pad_id, pairs)
    params = [p for p in engine.model.parameters() if p.requires_grad]
    engine.model.train()
    try:
        metrics = engine.optimize(batch, preference_loss_fn(engine), engine.optimizer, params,
                                  "actor")
    finally:
        engine.model.eval()
    metrics["actor/lr"] = engine.scheduler.get_last_lr()[0]
    metrics["pref/examples"] = float(batch.size)
    engine.scheduler.step()
    engine.version += 1
    return metrics


def preference_eval(engine: HybridEngine, examples: list[PreferenceExample]) -> dict[str, float]:
    """Held-out pairs: implicit-reward accuracy (ties half), margin, and how often the policy
    alone gives the chosen response the higher likelihood."""
    if not examples:
        return {}
    policy = response_logps(engine, examples)
    correct = likelihood = margin = n = 0.0
    for ex, lps in zip(examples, policy):
        assert ex.ref_logps is not None
        r = [p - q for p, q in zip(lps, ex.ref_logps)]
        for i, ri in enumerate(ex.ranks):
            for j, rj in enumerate(ex.ranks):
                if ri < rj:
                    d = r[i] - r[j]
                    correct += 1.0 if d > 0 else 0.5 if d == 0 else 0.0
                    likelihood += float(lps[i] > lps[j])
                    margin += engine.algo.beta * d
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
            out.append(_pair(best.turns[-1], worst.turns[-1]))
    return out


def _pair(chosen: Turn, rejected: Turn) -> PreferenceExample:
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
            out.append(_pair(w, lo))
    return out


# ---------------------------------------------------------------------------------- the loop
class PreferenceLoop:
    """``Trainer.run`` for preference algorithms: warm start, then one preference step per
    training step on data rows (offline) or on best-vs-worst pairs of fresh rollouts (online).

    Uses the trainer's run folder, engine, task splits, reward and SFT warm start; the metric
    names are ``pref/*`` for training and ``eval/pref_accuracy``, ``eval/accuracy`` for eval.
    """

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer
        self.cfg = trainer.cfg
        self.algo = self.cfg.policy.algorithm
        self.train_data: list[PreferenceExample] = []
        self.eval_data: list[PreferenceExample] = []
        if self.cfg.data.path is not None:
            unpaired = getattr(PREFERENCE_LOSSES.get(str(self.algo.preference_loss)),
                               "accepts_unpaired", False)
            self.train_data, self.eval_data = load_preference_data(
                self.cfg.data, trainer.engine.tokenizer, unpaired,
                {ex.prompt for ex in trainer.eval_set})
        # Online runs draw task prompts (the trainer's sampler); offline runs draw data rows.
        self.sampler = (trainer.sampler if self.algo.online
                        else PromptSampler(self.train_data, self.cfg.seed))

    def run(self, stop_after: int | None = None) -> dict[str, float]:
        t, cfg = self.t, self.cfg
        t.run_dir.write_config(dump_config(cfg))
        last = {} if self._resume() else self._warm_start()
        bar = StepProgress(cfg.train.steps, enabled=cfg.progress, start=t.step)
        try:
            while t.step < cfg.train.steps and (stop_after is None or stop_after > 0):
                with t.timer("update"):
                    metrics = self._train_step()
                t.step += 1
                if t.step % cfg.eval.every == 0 or t.step == cfg.train.steps:
                    metrics |= self.evaluate()
                metrics |= t.timer.pop()
                t.run_dir.log_metrics(t.step, metrics)
                last = metrics
                bar.update(t.step, metrics)
                if t.step % cfg.checkpoint.every == 0 or t.step == cfg.train.steps:
                    self.save()
                stop_after = None if stop_after is None else stop_after - 1
        finally:
            bar.close()
            plot_metrics(t.run_dir.read_metrics(), t.run_dir.path / "curves.png")
        if t.step == cfg.train.steps:
            t.engine.save_pretrained(t.run_dir.path / "final_model")
        return last

    def _train_step(self) -> dict[str, float]:
        cfg, eng = self.cfg, self.t.engine
        if not self.algo.online:
            return preference_step(eng, self.sampler.next(cfg.train.prompts_per_step),
                                   cfg.data.pairs)
        with self.t.timer("rollout"):
            out = rollout(eng, self.sampler.next(cfg.train.prompts_per_step),
                          cfg.train.group_size, self.t.reward_fn, cfg.task.name)
        pairs = best_worst_pairs(out.trajectories)
        metrics = self.t._rollout_metrics(out, collate(out.trajectories, eng.pad_id))
        metrics["pref/pairs"] = float(len(pairs))
        if pairs:  # every group tied: nothing to learn from this step
            metrics |= preference_step(eng, pairs, cfg.data.pairs)
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Held-out preference pairs (when there is data) and greedy exact match on the task."""
        t = self.t
        return preference_eval(t.engine, self.eval_data) | evaluate(
            t.engine, t.eval_set, t.reward_fn, self.cfg.task.name, self.cfg.eval.greedy)

    def _warm_start(self) -> dict[str, float]:
        """SFT (when configured); the result becomes the reference; step-0 eval and checkpoint."""
        t, eng = self.t, self.t.engine
        metrics: dict[str, float] = {}
        if self.cfg.sft.steps:
            with t.timer("sft"):
                metrics |= t.sft()
            eng.reset_reference()  # online: a frozen copy of the warm-started policy
            if eng.ref_model is not None:
                torch.save(eng.ref_model.state_dict(), t.run_dir.path / "reference.pt")
        with t.timer("reference"):  # offline: the policy, now, is the reference
            fill_reference(eng, self.train_data + self.eval_data)
        metrics |= self.evaluate() | t.timer.pop()
        t.run_dir.log_metrics(0, metrics)
        self.save()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.t.step, "engine": self.t.engine.state_dict(),
                "sampler": self.sampler.state_dict(), "rng": rng_state(),
                "ref_logps": [ex.ref_logps for ex in self.train_data + self.eval_data]}

    def save(self) -> None:
        self.t.run_dir.save_checkpoint(self.t.step, self.state_dict(),
                                       self.cfg.checkpoint.keep)

    def _resume(self) -> bool:
        t = self.t
        ckpt = t.run_dir.latest_checkpoint()
        if ckpt is None:
            return False
        state = load_checkpoint(ckpt)
        t.step = state["step"]
        t.engine.load_state_dict(state["engine"])
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        for ex, lps in zip(self.train_data + self.eval_data, state["ref_logps"]):
            ex.ref_logps = lps
        reference = t.run_dir.path / "reference.pt"
        if reference.is_file() and t.engine.needs_reference:
            t.engine.reset_reference()
            t.engine.ref_model.load_state_dict(torch.load(reference, weights_only=True))
        t.run_dir.truncate_metrics(t.step)
        log.warning("resumed from %s (step %d)", ckpt, t.step)
        return True
