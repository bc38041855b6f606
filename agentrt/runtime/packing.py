"""Micro-batches by token budget, and sequence packing, for the trainer's forward passes.

A batch is right-padded to its longest sequence, and a transformer computes every padded position
as if it were a token. Three things keep that padding out of the forward passes:

- **trimming**: every micro-batch is cut to its own longest row (always on);
- **length buckets** (``policy.micro_batch_tokens``): rows sorted by length fill micro-batches of at
  most that many computed positions, so rows of like length are padded together;
- **packing** (``policy.packing``): a micro-batch's sequences are concatenated into rows of about
  ``max(PACK_WIDTH, longest)`` positions (first-fit decreasing), with position ids restarting at
  every sequence. Transformers reads restarting position ids as packed sequences and confines
  attention to each one (a block-diagonal causal mask; ``use_cache=False`` is required, else it
  does not look), so every token sees exactly what it saw in its own padded row;
- **prefix sharing** (``policy.share_prefix``, with packing): rows that start with the same
  prompt (a GRPO group's completions) become one packed segment, the prompt once and then each
  completion, with a 4D attention mask that lets every completion see the prompt and itself
  only, and position ids continuing from the prompt's. The prompt's positions are computed once
  instead of once per row (the idea of Prefix Grouper, arXiv:2506.05433); every token still sees
  exactly what it saw in its own row, so log-probs and gradients are those of the padded batch.

A :class:`Layout` is the rows one forward pass computes; ``unpack`` brings a per-token result
([R, W], aligned like :func:`agentrt.runtime.steps.shift_logprobs`) back to the batch's [B, T] rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agentrt.algos.losses import entropy_from_logits
from agentrt.runtime.steps import shift_entropy, shift_logprobs

# Packed rows are at least this wide, so that short sequences of like length still share rows
# (rows as wide as the longest of 8-12-token sequences hold one each). Attention per token grows
# with the width, the rest does not: on llama-tiny/small 32-128 were equally fast, 256 slower.
PACK_WIDTH = 64
# Per layer a Llama block computes ~32 x hidden^2 FLOPs of matmuls per position and ~4 x width x
# hidden of attention over a packed row (every pair under the dense mask): by FLOPs they are equal
# at a width of 8 x hidden. But the dense mask's element-wise work per pair (mask, fp32 softmax,
# casts and their backward) costs more than its FLOPs say, and it depends on the CPU: on an Intel
# Xeon (fp32, eager, 1 thread) rows 239 wide cost the same per position as rows 39 wide; on an
# AMD EPYC, a bf16 compiled GRPO update of llama-small (32 prompts x 8 responses of 32 tokens)
# took 0.46-0.62 s with each prompt's 8 responses in one 263-wide row and 0.38-0.46 s with 4 (135
# wide) or 2 (71), fp32 the same either way, llama-tiny alike at 39-135 wide. 8 keeps such groups
# to rows of ~135 at hidden 256; short responses (6 tokens: rows of 55) still share whole groups.
ATTENTION_PER_POSITION = 8
# Shared segments are at most this wide: the 4D mask is rows x width^2 booleans (and SDPA may make
# it floats), 16 MB a row at 2048.
SHARE_MAX_WIDTH = 2048


def plan_micro_batches(lengths: list[int], max_rows: int, max_tokens: int | None = None,
                       packed: bool = False, rows: list[int] | None = None,
                       prefix: torch.Tensor | None = None,
                       input_ids: torch.Tensor | None = None) -> list[list[int]]:
    """Row indices of each micro-batch (indices into ``lengths``).

    Args:
        lengths: Tokens of each row (its attention mask's sum).
        max_rows: At most this many rows per micro-batch (``policy.micro_batch_size``).
        max_tokens: At most this many computed positions per micro-batch: rows x longest row when
            padded, the sum of lengths when ``packed``. None: consecutive chunks of ``max_rows``
            in batch order. A row longer than the budget goes alone.
        packed: Count a micro-batch's cost as packed rows do.
        rows: Packed only: rows each entry stands for (a prompt shared by several rows, whose
            ``lengths`` entry is the positions they compute together); 1 each by default.
        prefix, input_ids: Packed, with a token budget: buckets of whole prompt groups (see
            :func:`prompt_groups`), so that sorting by length does not split what is shared.
    """
    n = len(lengths)
    if max_tokens is None:
        return [list(range(s, min(n, s + max_rows))) for s in range(0, n, max_rows)]
    if prefix is not None and input_ids is not None:
        groups = prompt_groups(input_ids.cpu(), lengths, prefix.cpu())
        costs = [p + sum(lengths[i] - p for i in members) for p, members in groups]
        parts = plan_micro_batches(costs, max_rows, max_tokens, True, [len(m) for _, m in groups])
        return [[i for g in part for i in groups[g][1]] for part in parts]
    rows = rows or [1] * n
    order = sorted(range(n), key=lambda i: (-lengths[i], i))  # longest first: the first row of a
    parts: list[list[int]] = []                                # micro-batch sets its width
    cost = used = 0
    for i in order:
        if parts:
            part = parts[-1]
            grown = cost + lengths[i] if packed else (len(part) + 1) * lengths[part[0]]
            if used + rows[i] <= max_rows and grown <= max_tokens:
                part.append(i)
                cost, used = grown, used + rows[i]
                continue
        parts.append([i])
        cost, used = lengths[i], rows[i]
    return parts


def pack_rows(lengths: list[int], width: int) -> list[list[int]]:
    """First-fit decreasing: sequence indices per row of ``width`` positions (each at most
    ``width`` long). The first row that fits is found in a max-tree of the rows' free positions
    (rows not opened yet are empty), O(n log n): a scan of the open rows per sequence cost ~1 ms
    per call for a league batch, several calls per layout."""
    n = len(lengths)
    size = 1
    while size < n:
        size *= 2
    free = [width] * (2 * size)  # free[size + r]: row r's free positions; above: maxima
    rows: list[list[int]] = []
    for i in sorted(range(n), key=lengths.__getitem__, reverse=True):  # stable: ties by index
        need, node = lengths[i], 1
        while node < size:  # down to the leftmost row with room
            node = 2 * node if free[2 * node] >= need else 2 * node + 1
        if node - size == len(rows):
            rows.append([i])
        else:
            rows[node - size].append(i)
        free[node] -= need
        node //= 2
        while node:
            free[node] = max(free[2 * node], free[2 * node + 1])
            node //= 2
    return rows


@dataclass
class Layout:
    """The rows one forward pass computes for a [B, T] right-padded batch.

    Attributes:
        input_ids: [R, W] token ids of the computed rows.
        position_ids: [R, W] positions restarting per sequence (packed), None when padded.
        attention_mask: [R, W] padding mask (padded layout), [R, 1, W, W] boolean (True: may
            attend) with prefix sharing, None when packed without.
        src, dst: Packed only: flat [R*W] positions and the flat [B*T] positions they fill.
        pred: Packed only: the flat position whose logits predict the token at ``src`` (the one
            before it, or the shared prompt's last for a completion's first token).
        shape: (B, T) of the batch.
        tokens: Positions holding a real token; ``computed - tokens`` positions are padding.
        shared: Tokens of the batch not computed because their prompt was computed once for
            several rows.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor | None
    src: torch.Tensor | None
    dst: torch.Tensor | None
    shape: tuple[int, int]
    tokens: int
    pred: torch.Tensor | None = None
    shared: int = 0

    @property
    def computed(self) -> int:
        return int(self.input_ids.numel())

    def inputs(self, device: torch.device) -> dict[str, Any]:
        """Keyword arguments of the model's forward call."""
        out: dict[str, Any] = {"input_ids": self.input_ids.to(device), "use_cache": False}
        if self.attention_mask is not None:
            out["attention_mask"] = self.attention_mask.to(device)
        if self.position_ids is not None:
            out["position_ids"] = self.position_ids.to(device)
        return out

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """A per-token [R, W] result in the batch's [B, T] rows (differentiable). Packed: position
        0 of every sequence and the padding get 0 (what position 0 holds in a padded row)."""
        if self.src is None:
            return torch.nn.functional.pad(x, (0, self.shape[1] - x.shape[1]))
        return self.scatter(x.reshape(-1)[self.src.to(x.device)])

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        """Values of the packed layout's tokens, in ``src`` order, as the batch's [B, T] rows."""
        bsz, width = self.shape
        return x.new_zeros(bsz * width).index_copy(0, self.dst.to(x.device), x).view(bsz, width)


def layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, packed: bool,
           pad_id: int, prefix: torch.Tensor | None = None, hidden: int = 0) -> Layout:
    """The rows to compute for a right-padded [B, T] batch: trimmed to its longest row, or packed
    into rows of about ``max(PACK_WIDTH, longest)`` positions.

    ``prefix`` (packed only): [B] tokens before each row's first trained token; rows whose
    prefixes are the same tokens share one computation of them (see the module docstring). A
    segment of k rows computes P + k * S positions (prompt P, completions of S tokens) instead of
    k * (P + S), but each of them attends over its whole packed row: the dense mask computes every
    (query, key) pair. So groups are cut into segments of k rows, for the k whose packed rows
    cost least, a position in a row of width W costing 1 + W / (ATTENTION_PER_POSITION *
    ``hidden``) (``hidden`` 0 counts positions only), of at most SHARE_MAX_WIDTH positions."""
    bsz, width = input_ids.shape
    lengths = attention_mask.sum(-1).cpu()
    longest = int(lengths.max()) if bsz else 0
    tokens = int(lengths.sum())
    if not packed:
        return Layout(input_ids[:, :longest], attention_mask[:, :longest], None, None, None,
                      (bsz, width), tokens)
    input_ids = input_ids.cpu()  # the index arithmetic runs on the CPU; inputs() moves the rows
    n_tok = lengths.tolist()
    segments, seg_len, row_w, rows = plan_segments(prompt_groups(input_ids, n_tok, prefix),
                                                   n_tok, hidden)
    size, seg_tokens = len(rows) * row_w, sum(seg_len)
    # Per sequence: where its prefix starts, how long the shared prefix is (0: not shared), where
    # the rest starts; and per flat position its segment (attention stays within one).
    # (Python lists: a tensor's item writes cost ~100x more.)
    pstart, plen, sstart, seg_of = ([0] * bsz for _ in range(4))
    for r, members in enumerate(rows):
        at = r * row_w
        for s in members:
            p, seqs = segments[s]
            start, at = at, at + p
            for i in seqs:
                pstart[i], plen[i], seg_of[i], sstart[i] = start, p, s, at
                at += n_tok[i] - p
    pstart, plen, sstart, seg_of = (torch.tensor(x, dtype=torch.long)
                                    for x in (pstart, plen, sstart, seg_of))
    t = torch.arange(width)
    valid = t[None, :] < lengths[:, None]
    in_prefix = t[None, :] < plen[:, None]
    flat = torch.where(in_prefix, pstart[:, None] + t[None, :],
                       sstart[:, None] + t[None, :] - plen[:, None])
    # a completion's first token is predicted by the shared prompt's last position
    first = (t[None, :] == plen[:, None]) & (plen[:, None] > 0)
    pred = torch.where(first, (pstart + plen - 1)[:, None], flat - 1)
    ids = torch.full((size,), pad_id, dtype=input_ids.dtype)
    ids[flat[valid]] = input_ids[valid]
    # Padding at a row's end gets position 0 each: every pad is a one-token sequence of its own.
    pos = torch.zeros(size, dtype=torch.long)
    pos[flat[valid]] = t.expand(bsz, width)[valid]
    keep = valid & (t[None, :] > 0)  # position 0 predicts nothing (from the sequence before)
    dst = (torch.arange(bsz)[:, None] * width + t[None, :])[keep]
    mask = None
    if any(p > 0 for p, _ in segments):
        mask = share_mask(flat, valid, in_prefix, seg_of, len(segments), size, row_w)
    return Layout(ids.view(-1, row_w), mask, pos.view(-1, row_w), flat[keep], dst, (bsz, width),
                  seg_tokens, pred[keep], tokens - seg_tokens)


def plan_segments(groups: list[tuple[int, list[int]]], n_tok: list[int], hidden: int
                  ) -> tuple[list[tuple[int, list[int]]], list[int], int, list[list[int]]]:
    """How :func:`layout` packs prompt ``groups`` (see :func:`prompt_groups`) of rows of
    ``n_tok`` tokens: (segments as (shared prefix, rows), their lengths, the row width, the
    segments of each packed row), groups cut into segments of the k rows whose packing costs
    least (the smallest k among equals)."""
    scale = ATTENTION_PER_POSITION * hidden or float("inf")
    biggest = max((len(rows) for _, rows in groups), default=1)
    plans = []
    for k in sorted({min(k, biggest) for k in (1, 2, 4, 8, 16, biggest)}):
        segments = [(p if len(rows[c:c + k]) > 1 else 0, rows[c:c + k])
                    for p, rows in groups for c in range(0, len(rows), k)]
        seg_len = [p + sum(n_tok[i] - p for i in members) for p, members in segments]
        if k == 1 or max(seg_len) <= SHARE_MAX_WIDTH:
            # no packing of them costs less: every token, in rows at least the longest wide
            plans.append((sum(seg_len) * (1 + max(seg_len, default=0) / scale), k, segments,
                          seg_len))
    best = None  # the least cost, the smallest k among equals
    for bound, k, segments, seg_len in sorted(plans, key=lambda plan: plan[:2]):
        if best is not None and bound > best[0]:
            break
        size, row_w, rows = pack_segments(seg_len)
        cost = size * (1 + row_w / scale)
        if best is None or (cost, k) < best[:2]:
            best = (cost, k, segments, seg_len, row_w, rows)
    _, _, segments, seg_len, row_w, rows = best
    return segments, seg_len, row_w, rows


def share_mask(flat: torch.Tensor, valid: torch.Tensor, in_prefix: torch.Tensor,
               seg_of: torch.Tensor, n_segments: int, size: int, row_w: int) -> torch.Tensor:
    """[R, 1, W, W] attention mask of a packed layout with shared prefixes (True: may attend):
    causal within a segment, a completion seeing its prompt and itself only. ``flat`` [B, T]:
    each token's flat position; ``valid``/``in_prefix`` [B, T]: a token, in the shared prefix;
    ``seg_of`` [B]: each row's segment."""
    bsz, width = flat.shape
    seg = torch.arange(size) + n_segments  # padding: a segment of its own
    seg[flat[valid]] = seg_of[:, None].expand(bsz, width)[valid]
    branch = torch.full((size,), -1, dtype=torch.long)  # -1: the shared prefix
    branch[flat[valid & ~in_prefix]] = torch.arange(bsz)[:, None].expand(
        bsz, width)[valid & ~in_prefix]
    seg, branch = seg.view(-1, 1, row_w), branch.view(-1, 1, row_w)
    causal = torch.ones(row_w, row_w, dtype=torch.bool).tril()
    return ((seg.transpose(1, 2) == seg) & causal
            & ((branch == -1) | (branch.transpose(1, 2) == branch))).unsqueeze(1)


def trained_prefix(loss_mask: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B] tokens before each row's first trained token (its length when none is trained)."""
    trained = loss_mask > 0
    return torch.where(trained.any(-1), trained.float().argmax(-1),
                       attention_mask.sum(-1)).long()


def prompt_groups(input_ids: torch.Tensor, lengths: list[int], prefix: torch.Tensor | None
                  ) -> list[tuple[int, list[int]]]:
    """(shared prefix length, rows): rows whose first ``prefix`` tokens (at least 2, with
    something after them) are the same; every other row alone, with prefix 0."""
    if prefix is None:
        return [(0, [i]) for i in range(len(lengths))]
    groups: dict[tuple[int, ...], list[int]] = {}
    ids = input_ids.tolist()
    for i, (p, n) in enumerate(zip(prefix.tolist(), lengths)):
        key = tuple(ids[i][:p]) if 2 <= p < n else (-1 - i,)
        groups.setdefault(key, []).append(i)
    return [(len(key) if len(rows) > 1 else 0, rows) for key, rows in groups.items()]


def pack_segments(seg_len: list[int]) -> tuple[int, int, list[list[int]]]:
    """(positions, row width, segments per row): rows as wide as the longest segment, or of
    PACK_WIDTH narrowed to share the tokens evenly (96 tokens: 2 rows of 48, not 64 + 64),
    whichever computes fewer positions."""
    tokens, longest = sum(seg_len), max(seg_len, default=0)
    share = max(longest, -(-tokens // -(-tokens // max(longest, PACK_WIDTH))))
    plans = [(len(rows) * w, w, rows) for w in {longest, share}
             for rows in [pack_rows(seg_len, w)]]
    return min(plans, key=lambda p: p[:2])


@dataclass
class Forward:
    """The float logits [R, W, V] of one forward pass over ``layout`` (divided by the sampling
    temperature where asked), read back per token in the batch's [B, T] rows."""

    logits: torch.Tensor
    layout: Layout

    def logprobs(self) -> torch.Tensor:
        """[B, T] log-probs of the batch's tokens (see :func:`agentrt.runtime.steps.shift_logprobs`)."""
        lay = self.layout
        ids = lay.input_ids.to(self.logits.device)
        if lay.src is None:
            return lay.unpack(shift_logprobs(self.logits, ids))
        flat = self.logits.reshape(-1, self.logits.shape[-1])
        pred = lay.pred.to(flat.device)
        picked = flat[pred, ids.reshape(-1)[lay.src.to(flat.device)]]
        return lay.scatter(picked - torch.logsumexp(flat, dim=-1)[pred])

    def entropy(self, grad: bool = True) -> torch.Tensor:
        """[B, T] entropy of each token's distribution; ``grad`` False detaches it."""
        logits = self.logits if grad else self.logits.detach()
        lay = self.layout
        if lay.src is None:
            return lay.unpack(shift_entropy(logits))
        flat = logits.reshape(-1, logits.shape[-1])
        return lay.scatter(entropy_from_logits(flat[lay.pred.to(flat.device)]))


def packed_attention(model: torch.nn.Module, device: torch.device, share_prefix: bool = False
                     ) -> tuple[bool, bool]:
    """Whether ``model``'s log-probs over packed rows equal its padded ones (its attention stays
    within each packed sequence: it reads restarting position ids), and, with ``share_prefix``,
    over rows that share a prompt through a 4D attention mask (False when not asked).

    Every architecture of :data:`agentrt.policies.presets.ARCHITECTURES` passes both
    (tests/models/test_architectures.py); a leak moves tiny random models' log-probs by 0.2-0.5
    there, so the 1e-3 tolerance tells the two apart."""
    lengths = torch.tensor([6, 3, 5, 5])  # the two short ones share a packed row
    vocab = int(getattr(model.config, "vocab_size", 16))
    ids = (torch.arange(24).view(4, 6) * 7 + 3) % max(4, min(vocab, 64))
    ids[3, :3] = ids[2, :3]  # rows 2 and 3: one prompt of 3 tokens, two completions
    mask = (torch.arange(6)[None, :] < lengths[:, None]).long()

    def logprobs(packed: bool, prefix: torch.Tensor | None = None) -> torch.Tensor | None:
        lay = layout(ids, mask, packed, 0, prefix)
        try:
            with torch.no_grad():
                logits = model(**lay.inputs(device)).logits.float()
        except (ValueError, RuntimeError, TypeError, IndexError):
            if not packed:
                raise
            return None  # e.g. Bloom's ALiBi reads a 2D mask only: it cannot take the 4D one
        return Forward(logits, lay).logprobs().cpu() * mask

    def same(out: torch.Tensor | None) -> bool:
        return out is not None and torch.allclose(padded, out, atol=1e-3)

    padded = logprobs(False)
    packs = same(logprobs(True))
    return packs, packs and share_prefix and same(logprobs(True, torch.tensor([0, 0, 3, 3])))
