"""Retrieval into prompts and writing at episode end: the policy-independent half of memory.

The episode runner calls :func:`retrieve_context` before a policy acts and puts the returned
token ids into the prompt as they are (token in, token out: they are never re-tokenized). They
are prompt tokens, so they never carry loss; the returned record ids go into ``Turn.memory_ids``.
At episode end it calls :func:`write_episode_memories` with what the policy's config asks to keep.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal, Protocol, Sequence

from pydantic import Field

from agentrt.memory.bank import MemoryBank
from agentrt.core.schema import ConfigModel

WriteKind = Literal["outcome", "reflection", "facts"]
CONTEXT_HEADER = "Memories:\n"


class MemoryConfig(ConfigModel):
    """Memory settings of one policy (the ``memory:`` section of a policy config)."""

    bank: str = Field(..., min_length=1, description="Name of the bank (under memory.banks).")
    backend: Literal["faiss", "redis"] = Field("faiss", description="Backend of that bank.")
    k: int = Field(4, gt=0, description="Records retrieved per prompt, at most.")
    token_budget: int = Field(
        128, gt=0, description="Most prompt tokens retrieved memories may take, header included."
    )
    write: tuple[WriteKind, ...] = Field(
        ("outcome",), description="What to store at episode end: outcome, reflection, facts."
    )
    visibility: Literal["private", "shared"] = Field(
        "private", description="private: only this policy reads what it writes; shared: all do."
    )


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer that retrieval uses."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def format_record(text: str) -> str:
    """How one memory appears in the prompt: one bullet line."""
    return "- " + " ".join(text.split()) + "\n"


def retrieve_context(
    bank: MemoryBank,
    query_text: str,
    policy_id: str,
    k: int,
    token_budget: int,
    tokenizer: Tokenizer,
    filters: dict[str, Any] | None = None,
) -> tuple[list[int], list[str]]:
    """Token ids of the best memories for ``query_text`` that fit ``token_budget``.

    Private records of other policies are never returned (the query reads as ``policy_id``).
    Memories are taken best first; one that does not fit the remaining budget is skipped and the
    next is tried, so a long memory never crowds out shorter relevant ones.

    Args:
        bank: Bank to read.
        query_text: What the policy is about to answer (observation or prompt text).
        policy_id: The reading policy.
        k: Records retrieved, at most.
        token_budget: Most tokens returned, header (``"Memories:\\n"``) included.
        tokenizer: Encodes text to ids (``add_special_tokens=False``).
        filters: Extra metadata filter, e.g. ``{"env": "vault"}``.

    Returns:
        ``(context_token_ids, record_ids)``: ``len(context_token_ids) <= token_budget``, both
        empty when nothing relevant fits. ``record_ids`` are exactly the records included, in
        prompt order.
    """
    if not query_text or not query_text.strip() or k <= 0 or token_budget <= 0:
        return [], []
    hits = bank.query(query_text, k=k, filters=filters, reader=policy_id)
    header = tokenizer.encode(CONTEXT_HEADER, add_special_tokens=False)
    budget = token_budget - len(header)
    body: list[int] = []
    ids: list[str] = []
    for hit in hits:
        # Defence in depth: the bank already filtered by reader.
        rec = hit.record
        if rec.visibility == "private" and rec.policy_id != policy_id:
            continue
        piece = tokenizer.encode(format_record(rec.text), add_special_tokens=False)
        if len(body) + len(piece) <= budget:
            body += piece
            ids.append(rec.id)
    if not ids:
        return [], []
    return header + body, ids


def _texts(cfg: MemoryConfig, env: str, outcome: float | None, summary: str | None,
           reflections: Sequence[str], facts: Sequence[str]) -> list[tuple[str, str]]:
    """(text, kind) of each record ``cfg.write`` asks for, in the order they are written."""
    out: list[tuple[str, str]] = []
    if "outcome" in cfg.write and (outcome is not None or summary):
        parts = [f"Episode in {env or 'env'}"]
        if outcome is not None:
            parts.append(f"ended with outcome {outcome:+.3g}")
        out.append((" ".join(parts) + "." + (f" {summary.strip()}" if summary else ""), "outcome"))
    if "reflection" in cfg.write:
        out += [(text, "reflection") for text in reflections]
    if "facts" in cfg.write:
        out += [(text, "fact") for text in facts]
    return out


def write_episode_memories(
    bank: MemoryBank,
    cfg: MemoryConfig,
    *,
    policy_id: str,
    episode_id: str,
    env: str,
    outcome: float | None = None,
    summary: str | None = None,
    reflections: Sequence[str] = (),
    facts: Sequence[str] = (),
    tags: Sequence[str] = (),
    key: str | None = None,
) -> list[str]:
    """Stores what ``cfg.write`` asks for at the end of one episode; returns the new ids.

    With ``key`` the writes are idempotent: each record's id is :func:`record_id` of ``key``,
    its kind and its index among that kind, and a record whose id the bank already holds is not
    written again (a replayed episode after a resume rewrites nothing).

    Args:
        bank: Bank to write.
        cfg: The policy's memory config (``write`` and ``visibility`` are used).
        policy_id: The writing policy.
        episode_id: Episode the memories come from.
        env: Env name.
        outcome: Episode return or win/draw/loss score; written as "outcome" when set.
        summary: One line saying what happened (added to the outcome record).
        reflections: Texts the policy wrote about the episode ("reflection").
        facts: Facts the env revealed, e.g. ``info["revealed"]`` ("facts").
        tags: Extra tags on every record (e.g. the opponent's id).
        key: What identifies this write among all of the bank's (e.g. run, step, policy,
            episode and seat); None gives random ids.

    Returns:
        Ids of the records written, or already held under those ids (empty texts are skipped,
        never stored).
    """
    items: list[dict[str, Any]] = []
    base = dict(policy_id=policy_id, episode_id=episode_id, env=env, visibility=cfg.visibility)
    for text, kind in _texts(cfg, env, outcome, summary, reflections, facts):
        if text and text.strip():
            item = {**base, "text": text.strip(), "tags": (kind, *tags)}
            if key is not None:
                index = sum(it["tags"][0] == kind for it in items)
                item["id"] = record_id(key, kind, index)
            items.append(item)
    if not items:
        return []
    ids = [it.get("id") for it in items]
    if key is not None:
        held = {rec.id for rec in bank.get(ids) if rec is not None}
        items = [it for it in items if it["id"] not in held]
    written = bank.write_many(items) if items else []
    return ids if key is not None else written


def record_id(key: str, kind: str, index: int) -> str:
    """The id of the ``index``-th record of ``kind`` written under ``key`` (32 hex digits):
    the same write always gets the same id, so a replay overwrites instead of duplicating."""
    return hashlib.sha256(f"{key}|{kind}|{index}".encode()).hexdigest()[:32]
