"""Train a learned reward model for the arithmetic task: a small Llama sequence classifier
(one scalar head) that prefers the right answer, saved as a Hugging Face folder for
``reward: {model: FOLDER}``.

    # the recipe that drives GRPO about as far as exact match (docs/rewards.md, model F: its
    # --policy also lists GRPO policies trained with an earlier reward model of this recipe)
    python examples/train_reward_model.py --out runs/arith_rm --init runs/arith_sft/final_model \
        --policy runs/arith_sft/final_model --lm-steps 1200 --steps 1600 --lr 3e-4 \
        --extra-layers 2 --position-loss 1 --negative-weights off_by_10=6 tens_digit=6
    python examples/train_reward_model.py --out rm --steps 50 --preset llama-nano --lm-steps 0

Data: distinct prompts of the task's *training* split (the same generator and seed as
examples/arith_grpo.yaml, so the GRPO run's held-out prompts are never seen); ``--heldout``
of them are kept apart to measure the reward model. Each prompt's right answer is paired with
a wrong one of two sources:

* hard negatives, one kind per pair (:data:`NEGATIVES`), kinds drawn in proportion to
  ``--negative-weights KIND=W ...`` (1 each by default): off by 1, off by 10, off by a few, a
  digit changed, two digits swapped, one dropped or added, the sign flipped, the right answer
  followed by junk or repeated, truncated, empty, the tens digit changed;
* on-policy negatives (``--policy-share`` of the pairs, 0.5 by default): ``--policy-samples``
  replies to each of ``--policy-prompts`` prompts sampled (temperature 1) from ``--policy``, the
  SFT model GRPO starts from, those that exact match marks wrong: the distribution the reward
  model will score.

Model: the backbone of ``--init`` (a causal-LM folder: the policy's SFT model, as RLHF reward
models start from the SFT model) or a fresh ``--preset``, first trained ``--lm-steps`` more
steps of next-token loss on right answers (a classifier trained on pairs alone learns the
surface of answers, not the sums: it must be able to add to tell 57 from 58), then
``--extra-layers`` decoder layers on top that start as the identity, then a fresh scalar head,
all trained (``--freeze-backbone``: the new layers, final norm and head only) with ``--loss
bt`` (Bradley-Terry, ``-log sigmoid(r(right) - r(wrong))``) or ``--loss bce`` (pointwise:
right -> 1, wrong -> 0 on the same logit; saved with 2 labels, so the reward is P(right)).

Why the extra layers and ``--position-loss``: the backbone predicts each digit at the position
before it, so the last token (where the reward is read) can check its own digit against that
prediction, but not the tens digit: that verdict has to be formed at the tens digit's position
and gathered from there, which takes a layer to form it and one above to gather it. Without
them the reward passes answers off by 10 (docs/rewards.md). ``--position-loss W`` adds W times
a per-token loss on the layer below the last: "is the reply so far a prefix of the right
answer?" (:class:`PositionProbe`, not saved), so the verdicts are there to gather.

Reported (and written to ``OUT/reward_model.json``): on the held-out prompts, the share of
pairs ranked right per negative kind, and against the policy's own wrong samples.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from agentrt.rewards import exact_match
from agentrt.rewards.model import encode
from agentrt.envs.tasks import Example, encode_prompt, make_splits
from arith_negatives import NEGATIVES, negative  # noqa: F401 - the test reads them here

MAX_LENGTH = 64


def _prompts(tokenizer: Any, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and attention mask [B, T], as the rollout feeds them."""
    rows = [encode_prompt(tokenizer, p) for p in prompts]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


@torch.no_grad()
def policy_samples(folder: str | Path, prompts: list[str], k: int, seed: int,
                   max_new_tokens: int = 6, batch_size: int = 512) -> list[list[str]]:
    """``k`` replies per prompt sampled at temperature 1 from the causal LM in ``folder``,
    decoded as the rollout decodes them (special tokens dropped)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    lm = AutoModelForCausalLM.from_pretrained(folder).eval()
    torch.manual_seed(seed)
    out: list[list[str]] = []
    for i in range(0, len(prompts), batch_size):
        ids, mask = _prompts(tokenizer, prompts[i:i + batch_size])
        width = ids.shape[1]
        gen = lm.generate(input_ids=ids.repeat_interleave(k, 0),
                          attention_mask=mask.repeat_interleave(k, 0), do_sample=True,
                          temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                          pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
        out += [texts[j:j + k] for j in range(0, len(texts), k)]
    return out


def policy_negatives(folders: str | Path | list[str] | None, examples: list[Example], k: int,
                     seed: int, limit: int | None = None) -> list[list[str]]:
    """Per example, the distinct replies sampled from any of ``folders`` that exact match
    marks wrong (sampled for the first ``limit`` examples only; none for the rest)."""
    folders = [folders] if isinstance(folders, (str, Path)) else folders or []
    sampled = examples[:limit]
    wrong: list[set[str]] = [set() for _ in sampled]
    for folder in folders if k else []:
        samples = policy_samples(folder, [ex.prompt for ex in sampled], k, seed)
        for bad, ex, group in zip(wrong, sampled, samples):
            bad |= {s for s in group if not exact_match(ex.prompt, s, ex.info)}
    return [sorted(bad) for bad in wrong] + [[] for _ in examples[len(sampled):]]


def build_classifier(preset: str, seed: int, init: str | None, lm_steps: int, lr: float,
                     batch_size: int, train_set: list[Example], extra_layers: int,
                     heldout_set: list[Example]) -> tuple[Any, Any, float]:
    """A 1-label LlamaForSequenceClassification with the byte tokenizer of agentrt's presets:
    its backbone from ``init`` (a causal-LM folder) or a fresh ``preset`` model, first trained
    ``lm_steps`` steps on ``prompt + answer + eos``, then ``extra_layers`` more decoder layers
    on top that start as the identity, and a fresh scalar head. Also returns the backbone's
    greedy exact match on ``heldout_set`` (how well it adds)."""
    from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig,
                              LlamaForSequenceClassification)

    from agentrt.policies.models import build_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(init) if init else build_model(Path(tmp) / "base", preset, seed=seed)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        lm = AutoModelForCausalLM.from_pretrained(folder)
        if lm_steps:
            language_model(lm, tokenizer, train_set, lm_steps, lr, batch_size, seed)
            folder = Path(tmp) / "lm"
            lm.save_pretrained(folder)
        adds = greedy_accuracy(lm, tokenizer, heldout_set)
        config = LlamaConfig.from_pretrained(folder, num_labels=1,
                                             pad_token_id=tokenizer.pad_token_id)
        depth = config.num_hidden_layers
        config.num_hidden_layers = depth + extra_layers
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification.from_pretrained(folder, config=config)
    with torch.no_grad():  # the new layers add nothing to the residual stream at first
        for layer in model.model.layers[depth:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return model, tokenizer, adds


@torch.no_grad()
def greedy_accuracy(lm: Any, tokenizer: Any, examples: list[Example]) -> float:
    """Greedy exact match of a causal LM on ``examples`` (6 new tokens at most)."""
    lm.eval()
    ids, mask = _prompts(tokenizer, [ex.prompt for ex in examples])
    width = ids.shape[1]
    gen = lm.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=6,
                      pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
    return sum(exact_match(ex.prompt, t, ex.info) for ex, t in zip(examples, texts)) / len(texts)


def language_model(lm: Any, tokenizer: Any, train_set: list[Example], steps: int, lr: float,
                   batch_size: int, seed: int) -> None:
    """Next-token training on the answers (loss on the answer and eos only)."""
    rng = random.Random(seed + 2)
    opt = torch.optim.AdamW(lm.parameters(), lr=lr)
    sched = _schedule(opt, steps)
    lm.train()
    for _ in range(steps):
        rows, labels = [], []
        for ex in rng.sample(train_set, min(batch_size, len(train_set))):
            prompt = encode_prompt(tokenizer, ex.prompt)
            answer = tokenizer.encode(ex.answer, add_special_tokens=False) + [
                tokenizer.eos_token_id]
            rows.append(prompt + answer)
            labels.append([-100] * len(prompt) + answer)
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        loss = lm(input_ids=ids, attention_mask=mask, labels=lab).loss
        _update(opt, sched, lm, loss)


def _schedule(opt: torch.optim.Optimizer, steps: int) -> Any:
    """Linear warm-up over 5% of the steps, then linear decay to 10%."""
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, steps // 20)) * max(0.1, 1 - s / steps))


def _update(opt: torch.optim.Optimizer, sched: Any, model: Any, loss: torch.Tensor) -> None:
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()


class PositionProbe:
    """A linear head on the layer below the last that reads, at each reply token, whether the
    reply so far is a prefix of the right answer. Trained beside the reward (``--position-loss``)
    and then dropped: the saved model is the classifier alone. Why: the reward is read at the
    last token, which can check its own digit against the backbone's prediction one position
    back, but an earlier digit's verdict must be formed at that digit's position (with the
    prediction made before it) and gathered from there by the last layer; this supervises
    the verdicts where the last layer can gather them."""

    def __init__(self, model: Any, depth: int) -> None:
        self.norm = model.model.norm
        self.head = torch.nn.Linear(model.config.hidden_size, 1)
        self.hidden: torch.Tensor | None = None
        model.model.layers[depth - 1].register_forward_hook(self._keep)

    def _keep(self, module: Any, args: Any, out: Any) -> None:
        self.hidden = out[0] if isinstance(out, tuple) else out

    def loss(self, tokenizer: Any, responses: list[str], answers: list[str]) -> torch.Tensor:
        """BCE over the reply tokens of the last forward pass (left-padded, so a reply's
        tokens are its row's last ones): label 1 where the reply so far starts the answer."""
        assert self.hidden is not None
        logits = self.head(self.norm(self.hidden))[..., 0]  # [B, T]
        rows, cols, labels = prefix_labels(tokenizer, responses, answers, logits.shape[1])
        if not rows:
            return logits.sum() * 0
        return F.binary_cross_entropy_with_logits(logits[rows, cols], torch.tensor(labels))


def prefix_labels(tokenizer: Any, responses: list[str], answers: list[str],
                  width: int) -> tuple[list[int], list[int], list[float]]:
    """(row, column, label) of each reply character's last token in left-padded rows of
    ``width`` tokens (a reply is its row's end): 1.0 where the reply up to that character is
    a prefix of the answer."""
    rows, cols, labels = [], [], []
    for b, (response, answer) in enumerate(zip(responses, answers)):
        for j in range(len(response)):
            after = len(tokenizer.encode(response[j + 1:], add_special_tokens=False))
            rows.append(b)
            cols.append(width - 1 - after)
            labels.append(float(answer.startswith(response[:j + 1])))
    return rows, cols, labels


def draw_pairs(examples: list[Example], policy_wrong: list[list[str]], n: int,
               rng: random.Random, weights: dict[str, float] | None = None,
               policy_share: float = 0.5) -> list[tuple[str, str, str]]:
    """``n`` (prompt, right, wrong) pairs: ``policy_share`` of them of prompts with policy
    samples, a policy sample as the wrong reply; the rest with a hard negative of a kind drawn
    in proportion to ``weights`` (default 1 per kind)."""
    sampled = [i for i, wrong in enumerate(policy_wrong) if wrong]
    kinds = list(NEGATIVES)
    odds = [(weights or {}).get(kind, 1.0) for kind in kinds]
    out = []
    for _ in range(n):
        if sampled and rng.random() < policy_share:
            i = rng.choice(sampled)
            out.append((examples[i].prompt, examples[i].answer, rng.choice(policy_wrong[i])))
        else:
            ex = rng.choice(examples)
            kind = rng.choices(kinds, odds)[0]
            out.append((ex.prompt, ex.answer, negative(kind, ex.answer, rng)))
    return out


def parse_weights(items: list[str]) -> dict[str, float]:
    """``["off_by_10=6", ...]`` -> ``{"off_by_10": 6.0}``; unknown kinds and negative weights
    are one-line errors naming the valid kinds."""
    out = {}
    for item in items:
        kind, _, value = item.partition("=")
        if kind not in NEGATIVES:
            raise ValueError(f"--negative-weights: unknown kind {kind!r}; valid: "
                             f"{', '.join(NEGATIVES)}")
        try:
            out[kind] = float(value)
        except ValueError:
            raise ValueError(f"--negative-weights: {item!r} is not KIND=NUMBER") from None
        if out[kind] < 0:
            raise ValueError(f"--negative-weights: {kind} has a negative weight")
    return out


@torch.no_grad()
def scores(model: Any, tokenizer: Any, prompts: list[str], responses: list[str],
           batch_size: int = 512) -> torch.Tensor:
    """[N] rewards (the scalar head's logit), in eval mode."""
    was_training = model.training
    model.eval()
    out = [model(**encode(tokenizer, prompts[i:i + batch_size], responses[i:i + batch_size],
                          MAX_LENGTH)).logits[:, 0]
           for i in range(0, len(prompts), batch_size)]
    model.train(was_training)
    return torch.cat(out).float()


def evaluate(model: Any, tokenizer: Any, examples: list[Example],
             policy_wrong: list[list[str]], seed: int) -> dict[str, float]:
    """Share of held-out pairs where the right answer scores above the wrong one, per
    negative kind (one pair per prompt and kind), against every wrong policy sample
    (``policy``), and over all of them (``all``)."""
    rng = random.Random(seed)
    rows: dict[str, list[tuple[str, str, str]]] = {
        kind: [(ex.prompt, ex.answer, negative(kind, ex.answer, rng)) for ex in examples]
        for kind in NEGATIVES}
    rows["policy"] = [(ex.prompt, ex.answer, w) for ex, ws in zip(examples, policy_wrong)
                      for w in ws]
    flat = [r for kind_rows in rows.values() for r in kind_rows]
    good = scores(model, tokenizer, [p for p, _, _ in flat], [r for _, r, _ in flat])
    bad = scores(model, tokenizer, [p for p, _, _ in flat], [w for _, _, w in flat])
    wins = (good > bad).float()
    result, at = {}, 0
    for kind, kind_rows in rows.items():
        if kind_rows:
            result[kind] = float(wins[at:at + len(kind_rows)].mean())
        at += len(kind_rows)
    result["all"] = float(wins.mean())
    return result


def pair_loss(model: Any, tokenizer: Any, batch: list[tuple[str, str, str]], loss: str,
              probe: PositionProbe, position_loss: float) -> torch.Tensor:
    """The loss of a batch of (prompt, right, wrong) pairs: Bradley-Terry (``bt``) or
    pointwise (``bce``) on the head's logit, plus ``position_loss`` times the probe's."""
    prompts = [p for p, _, _ in batch] * 2
    responses = [r for _, r, _ in batch] + [w for _, _, w in batch]
    logits = model(**encode(tokenizer, prompts, responses, MAX_LENGTH)).logits[:, 0]
    good, bad = logits[:len(batch)], logits[len(batch):]
    if loss == "bt":
        value = -F.logsigmoid(good - bad).mean()
    else:  # pointwise, balanced: one right and one wrong reply per prompt
        value = (F.softplus(-good) + F.softplus(bad)).mean()
    if position_loss:
        answers = [r for _, r, _ in batch] * 2
        value = value + position_loss * probe.loss(tokenizer, responses, answers)
    return value


def probability_head(model: Any) -> Any:
    """The classifier with 2 labels whose label-1 probability is ``sigmoid(logit)``: a
    pointwise model's reward is then P(right), near 0 for every wrong reply, so a group of
    wrong replies gets no advantage from how the logits happen to order them."""
    from transformers import LlamaForSequenceClassification

    config = copy.deepcopy(model.config)
    config.num_labels = 2
    out = LlamaForSequenceClassification(config)
    state = model.state_dict()
    weight = state.pop("score.weight")
    state["score.weight"] = torch.cat([torch.zeros_like(weight), weight])
    out.load_state_dict(state)
    return out


def split_prompts(train_set: list[Example], heldout: int,
                  seed: int) -> tuple[list[Example], list[Example]]:
    """(training, held-out) examples with distinct prompts, no prompt in both."""
    unique = list({ex.prompt: ex for ex in train_set}.values())
    random.Random(seed).shuffle(unique)
    return unique[heldout:], unique[:heldout]


def train(out: str | Path, preset: str = "llama-tiny", steps: int = 600, batch_size: int = 64,
          lr: float = 1e-3, seed: int = 0, digits: int = 2, ops: tuple[str, ...] = ("+",),
          train_size: int = 20000, eval_size: int = 256, heldout: int = 256,
          task_seed: int = 1234, init: str | None = None, lm_steps: int = 300, lm_lr: float = 1e-3,
          policy: str | list[str] | None = None, policy_samples_per_prompt: int = 4,
          policy_prompts: int = 2000, loss: str = "bce", extra_layers: int = 0,
          negative_weights: dict[str, float] | None = None, policy_share: float = 0.5,
          position_loss: float = 0.0, freeze_backbone: bool = False,
          log_every: int = 50) -> dict[str, Any]:
    """Trains and saves the reward model to ``out``. Returns the final loss and the held-out
    pair accuracies (``heldout_accuracy``: over all pairs; ``heldout_by_kind``), also
    written to ``out/reward_model.json``."""
    if loss not in ("bt", "bce"):
        raise ValueError(f"loss must be 'bt' or 'bce', got {loss!r}")
    rng = random.Random(seed)
    options = {"digits": digits, "ops": list(ops)}
    # the task's eval split is GRPO's held-out set: only the training split is used here
    task_train, _ = make_splits("arithmetic", options, train_size, eval_size, task_seed)
    train_set, heldout_set = split_prompts(task_train, heldout, seed + 1)
    train_wrong = policy_negatives(policy, train_set, policy_samples_per_prompt, seed + 3,
                                   policy_prompts)
    heldout_wrong = policy_negatives(policy, heldout_set, policy_samples_per_prompt, seed + 4)
    model, tokenizer, adds = build_classifier(preset, seed, init, lm_steps, lm_lr, batch_size,
                                              train_set, extra_layers, heldout_set)
    print(f"backbone greedy exact match on the held-out prompts: {adds:.3f}", flush=True)
    if freeze_backbone:  # keep the sums it learned to predict; only the layers above learn
        depth = model.config.num_hidden_layers - extra_layers
        for part in (model.model.embed_tokens, *model.model.layers[:depth]):
            part.requires_grad_(False)
    model.train()
    value = torch.tensor(0.0)
    probe = PositionProbe(model, model.config.num_hidden_layers - 1)
    opt = torch.optim.AdamW([p for p in [*model.parameters(), *probe.head.parameters()]
                             if p.requires_grad], lr=lr, weight_decay=0.0)
    sched = _schedule(opt, steps)
    for step in range(1, steps + 1):
        batch = draw_pairs(train_set, train_wrong, batch_size, rng, negative_weights,
                           policy_share)
        value = pair_loss(model, tokenizer, batch, loss, probe, position_loss)
        _update(opt, sched, model, value)
        if log_every and step % log_every == 0:
            acc = evaluate(model, tokenizer, heldout_set, heldout_wrong, seed + 5)
            print(f"step {step:5d}  loss {value.item():.4f}  held-out pair accuracy "
                  f"{acc['all']:.3f}  off_by_1 {acc['off_by_1']:.3f}  off_by_10 "
                  f"{acc['off_by_10']:.3f}  tens_digit {acc['tens_digit']:.3f}  policy "
                  f"{acc.get('policy', float('nan')):.3f}", flush=True)
    by_kind = evaluate(model, tokenizer, heldout_set, heldout_wrong, seed + 5)
    result = {"loss": value.item(), "heldout_accuracy": by_kind["all"],
              "heldout_by_kind": by_kind, "heldout_prompts": len(heldout_set),
              "heldout_policy_pairs": sum(len(w) for w in heldout_wrong),
              "backbone_exact_match": adds, "steps": steps, "lm_steps": lm_steps,
              "extra_layers": extra_layers, "loss_kind": loss, "preset": preset,
              "init": init, "policy": policy, "digits": digits,
              "negative_weights": negative_weights or {}, "policy_share": policy_share,
              "position_loss": position_loss, "freeze_backbone": freeze_backbone}
    out = Path(out)
    if loss == "bce":
        model = probability_head(model)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "reward_model.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder to save the reward model to")
    ap.add_argument("--preset", default="llama-tiny", help="model preset when no --init")
    ap.add_argument("--init", default=None, help="causal-LM folder to start the backbone from")
    ap.add_argument("--policy", nargs="+", default=None,
                    help="causal-LM folders to sample negatives of: the policy GRPO starts "
                         "from, and for a refreshed model also GRPO policies trained with it")
    ap.add_argument("--policy-samples", type=int, default=4, help="samples per prompt")
    ap.add_argument("--policy-prompts", type=int, default=2000,
                    help="training prompts to sample the policy on")
    ap.add_argument("--steps", type=int, default=600, help="pair training steps")
    ap.add_argument("--batch-size", type=int, default=64, help="pairs per step")
    ap.add_argument("--lr", type=float, default=1e-3,
                    help="pair-training learning rate (3e-4 with --extra-layers: at 1e-3 "
                         "they did not learn near misses)")
    ap.add_argument("--loss", choices=("bt", "bce"), default="bce",
                    help="bce ranked near misses far better than bt here (docs/rewards.md)")
    ap.add_argument("--lm-steps", type=int, default=300,
                    help="next-token steps on right answers before the pairs")
    ap.add_argument("--extra-layers", type=int, default=0,
                    help="decoder layers added on top of the backbone (start as the identity)")
    ap.add_argument("--negative-weights", nargs="*", default=[], metavar="KIND=W",
                    help="relative weights of hard-negative kinds (default 1 each), e.g. "
                         "off_by_10=6 tens_digit=6")
    ap.add_argument("--policy-share", type=float, default=0.5,
                    help="share of pairs whose wrong reply is a policy sample")
    ap.add_argument("--position-loss", type=float, default=0.0,
                    help="weight of a per-token 'reply right so far' loss on the layer below "
                         "the last (a training aid; not saved)")
    ap.add_argument("--freeze-backbone", action="store_true",
                    help="train only the --extra-layers, the final norm and the head")
    ap.add_argument("--digits", type=int, default=2)
    ap.add_argument("--train-size", type=int, default=20000, help="task training examples")
    ap.add_argument("--heldout", type=int, default=256, help="prompts kept apart to measure")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        weights = parse_weights(args.negative_weights)
    except ValueError as e:
        ap.error(str(e))
    result = train(args.out, args.preset, args.steps, args.batch_size, args.lr, args.seed,
                   args.digits, train_size=args.train_size, heldout=args.heldout,
                   init=args.init, lm_steps=args.lm_steps, policy=args.policy,
                   policy_samples_per_prompt=args.policy_samples,
                   policy_prompts=args.policy_prompts, loss=args.loss,
                   extra_layers=args.extra_layers,
                   negative_weights=weights,
                   policy_share=args.policy_share, position_loss=args.position_loss,
                   freeze_backbone=args.freeze_backbone)
    kinds = "  ".join(f"{k} {v:.3f}" for k, v in result["heldout_by_kind"].items())
    print(f"saved {args.out}: held-out pair accuracy by kind: {kinds}")


if __name__ == "__main__":
    main()
