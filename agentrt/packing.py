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
  does not look), so every token sees exactly what it saw in its own padded row.

A :class:`Layout` is the rows one forward pass computes; ``unpack`` brings a per-token result
([R, W], aligned like :func:`agentrt.steps.shift_logprobs`) back to the batch's [B, T] rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agentrt.steps import shift_entropy, shift_logprobs

# Packed rows are at least this wide, so that short sequences of like length still share rows
# (rows as wide as the longest of 8-12-token sequences hold one each). Attention per token grows
# with the width, the rest does not: on llama-tiny/small 32-128 were equally fast, 256 slower.
PACK_WIDTH = 64


def plan_micro_batches(lengths: list[int], max_rows: int, max_tokens: int | None = None,
                       packed: bool = False) -> list[list[int]]:
    """Row indices of each micro-batch.

    Args:
        lengths: Tokens of each row (its attention mask's sum).
        max_rows: At most this many rows per micro-batch (``policy.micro_batch_size``).
        max_tokens: At most this many computed positions per micro-batch: rows x longest row when
            padded, the sum of lengths when ``packed``. None: consecutive chunks of ``max_rows``
            in batch order. A row longer than the budget goes alone.
        packed: Count a micro-batch's cost as packed rows do.
    """
    n = len(lengths)
    if max_tokens is None:
        return [list(range(s, min(n, s + max_rows))) for s in range(0, n, max_rows)]
    order = sorted(range(n), key=lambda i: (-lengths[i], i))  # longest first: the first row of a
    parts: list[list[int]] = []                                # micro-batch sets its width
    cost = 0
    for i in order:
        if parts:
            part = parts[-1]
            grown = cost + lengths[i] if packed else (len(part) + 1) * lengths[part[0]]
            if len(part) < max_rows and grown <= max_tokens:
                part.append(i)
                cost = grown
                continue
        parts.append([i])
        cost = lengths[i]
    return parts


def pack_rows(lengths: list[int], width: int) -> list[list[int]]:
    """First-fit decreasing: sequence indices per row of ``width`` positions."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        slot = next((r for r, f in enumerate(free) if f >= lengths[i]), None)
        if slot is None:
            rows.append([i])
            free.append(width - lengths[i])
        else:
            rows[slot].append(i)
            free[slot] -= lengths[i]
    return rows


@dataclass
class Layout:
    """The rows one forward pass computes for a [B, T] right-padded batch.

    Attributes:
        input_ids: [R, W] token ids of the computed rows.
        attention_mask: [R, W] padding mask (padded layout), None when packed.
        position_ids: [R, W] positions restarting per sequence (packed), None when padded.
        src, dst: Packed only: flat [R*W] positions and the flat [B*T] positions they fill.
        shape: (B, T) of the batch.
        tokens: Real tokens in the batch; ``computed - tokens`` positions are padding.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor | None
    src: torch.Tensor | None
    dst: torch.Tensor | None
    shape: tuple[int, int]
    tokens: int

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
        bsz, width = self.shape
        if self.src is None:
            return torch.nn.functional.pad(x, (0, width - x.shape[1]))
        dst, src = self.dst.to(x.device), self.src.to(x.device)
        return x.new_zeros(bsz * width).index_copy(0, dst, x.reshape(-1)[src]).view(bsz, width)


def layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, packed: bool,
           pad_id: int) -> Layout:
    """The rows to compute for a right-padded [B, T] batch: trimmed to its longest row, or packed
    into rows of about ``max(PACK_WIDTH, longest)`` positions."""
    bsz, width = input_ids.shape
    lengths = attention_mask.sum(-1).cpu()
    longest = int(lengths.max()) if bsz else 0
    tokens = int(lengths.sum())
    if not packed:
        return Layout(input_ids[:, :longest], attention_mask[:, :longest], None, None, None,
                      (bsz, width), tokens)
    input_ids = input_ids.cpu()  # the index arithmetic runs on the CPU; inputs() moves the rows
    # Rows as wide as the longest sequence, or of PACK_WIDTH narrowed to share the tokens evenly
    # (96 tokens: 2 rows of 48, not 64 + 64), whichever computes fewer positions.
    share = max(longest, -(-tokens // -(-tokens // max(longest, PACK_WIDTH))))
    plans = [(len(rows) * w, w, rows) for w in {longest, share}
             for rows in [pack_rows(lengths.tolist(), w)]]
    size, row_w, rows = min(plans, key=lambda p: p[:2])
    start = torch.empty(bsz, dtype=torch.long)  # flat position of each sequence's first token
    for r, members in enumerate(rows):
        at = r * row_w
        for i in members:
            start[i] = at
            at += int(lengths[i])
    t = torch.arange(width)
    valid = t[None, :] < lengths[:, None]
    flat = start[:, None] + t[None, :]
    ids = torch.full((size,), pad_id, dtype=input_ids.dtype)
    ids[flat[valid]] = input_ids[valid]
    # Padding at a row's end gets position 0 each: every pad is a one-token sequence of its own.
    pos = torch.zeros(size, dtype=torch.long)
    pos[flat[valid]] = t.expand(bsz, width)[valid]
    keep = valid & (t[None, :] > 0)  # position 0 predicts nothing (from the sequence before)
    dst = (torch.arange(bsz)[:, None] * width + t[None, :])[keep]
    return Layout(ids.view(-1, row_w), None, pos.view(-1, row_w), flat[keep], dst, (bsz, width),
                  tokens)


@dataclass
class Forward:
    """The float logits [R, W, V] of one forward pass over ``layout`` (divided by the sampling
    temperature where asked), read back per token in the batch's [B, T] rows."""

    logits: torch.Tensor
    layout: Layout

    def logprobs(self) -> torch.Tensor:
        """[B, T] log-probs of the batch's tokens (see :func:`agentrt.steps.shift_logprobs`)."""
        ids = self.layout.input_ids.to(self.logits.device)
        return self.layout.unpack(shift_logprobs(self.logits, ids))

    def entropy(self, grad: bool = True) -> torch.Tensor:
        """[B, T] entropy of each token's distribution; ``grad`` False detaches it."""
        return self.layout.unpack(shift_entropy(self.logits if grad else self.logits.detach()))


def check_packing(model: torch.nn.Module, device: torch.device) -> None:
    """Raises ConfigError when ``model``'s attention does not stay within packed sequences (an
    architecture whose transformers code ignores restarting position ids)."""
    from agentrt.errors import ConfigError

    lengths = torch.tensor([6, 3, 3])  # the two short ones share a packed row
    vocab = int(getattr(model.config, "vocab_size", 16))
    ids = (torch.arange(18).view(3, 6) * 7 + 3) % max(4, min(vocab, 64))
    mask = (torch.arange(6)[None, :] < lengths[:, None]).long()
    outs = []
    with torch.no_grad():
        for packed in (False, True):
            lay = layout(ids, mask, packed, pad_id=0)
            logits = model(**lay.inputs(device)).logits.float()
            outs.append(Forward(logits, lay).logprobs().cpu() * mask)
    if not torch.allclose(outs[0], outs[1], atol=1e-3):
        raise ConfigError(f"policy.packing: {type(model).__name__} does not confine attention to "
                          "packed sequences (its attention ignores restarting position ids); set "
                          "policy.packing: false")
