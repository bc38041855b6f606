"""Retrieval into prompts under a token budget, privacy, and episode-end writes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentrt.memory.config import bank_config
from agentrt.memory.faiss_bank import FaissBank
from agentrt.memory.augment import (
    CONTEXT_HEADER,
    MemoryConfig,
    format_record,
    retrieve_context,
    write_episode_memories,
)
from agentrt.policies.models import build_tokenizer
from agentrt.core.types import Trajectory, Turn


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()  # byte-level: one token per ASCII character


def n_tokens(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False))


def test_memory_config_is_validated():
    cfg = MemoryConfig(bank="notes", write=["outcome", "facts"])
    assert cfg.k == 4 and cfg.visibility == "private" and cfg.write == ("outcome", "facts")
    for bad in ({"bank": "n", "k": 0}, {"bank": "n", "write": ["gossip"]}, {"bank": "n", "x": 1},
                {"bank": "n", "visibility": "public"}, {"bank": ""}):
        with pytest.raises(ValidationError):
            MemoryConfig(**bad)
    with pytest.raises(ValidationError):
        cfg.k = 3  # frozen


def test_context_respects_budget_and_reports_exact_ids(tok):
    bank = FaissBank(bank_config(name="r"))
    long_id = bank.write("vault vault code " + "blah " * 60, policy_id="a")
    short = [bank.write(f"vault code {c}", policy_id="a") for c in ("4512", "9981")]
    budget = n_tokens(tok, CONTEXT_HEADER) + 2 * n_tokens(tok, format_record("vault code 4512"))
    ids, rec_ids = retrieve_context(bank, "vault code", "a", k=5, token_budget=budget,
                                    tokenizer=tok)
    assert len(ids) <= budget and set(rec_ids) == set(short) and long_id not in rec_ids
    text = tok.decode(ids)
    assert text.startswith(CONTEXT_HEADER) and "vault code 4512" in text and "blah" not in text
    # Token-exact: the ids are header + each included record's line, in the order reported.
    expect = tok.encode(CONTEXT_HEADER, add_special_tokens=False)
    for rid in rec_ids:
        expect += tok.encode(format_record(bank.get([rid])[0].text), add_special_tokens=False)
    assert ids == expect
    assert retrieve_context(bank, "vault code", "a", 5, 5, tok) == ([], [])  # nothing fits
    top = bank.query("vault code", k=1, reader="a")[0].id
    assert retrieve_context(bank, "vault code", "a", 1, 10_000, tok)[1] == [top]


def test_private_memories_of_opponents_are_never_retrieved(tok):
    bank = FaissBank(bank_config(name="league"))
    secret = bank.write("my strategy against bob: bluff with jack", policy_id="alice",
                        visibility="private")
    public = bank.write("bob folds to raises", policy_id="carol", visibility="shared")
    _, as_bob = retrieve_context(bank, "strategy against bob bluff jack", "bob", 5, 500, tok)
    _, as_alice = retrieve_context(bank, "strategy against bob bluff jack", "alice", 5, 500, tok)
    assert secret not in as_bob and public in as_bob
    assert secret in as_alice and public in as_alice


def test_episode_memories_are_written_as_configured_and_found_next_episode(tok):
    bank = FaissBank(bank_config(name="ep"))
    cfg = MemoryConfig(bank="ep", write=["outcome", "facts"], visibility="private")
    ids = write_episode_memories(
        bank, cfg, policy_id="alice", episode_id="e1", env="vault", outcome=1.0,
        summary="Guessed 4512 and the door opened.", reflections=["try low numbers first"],
        facts=["the vault code is 4512", "  "], tags=["opponent:none"],
    )
    recs = bank.get(ids)
    kinds = sorted(r.tags[0] for r in recs)
    assert kinds == ["fact", "outcome"]  # reflections not asked for; blank fact skipped
    assert all(r.visibility == "private" and r.episode_id == "e1" and r.env == "vault"
               and "opponent:none" in r.tags for r in recs)
    assert "+1" in next(r.text for r in recs if "outcome" in r.tags)
    ctx, used = retrieve_context(bank, "what is the vault code", "alice", 2, 200, tok)
    assert "4512" in tok.decode(ctx) and set(used) <= set(ids)
    assert retrieve_context(bank, "what is the vault code", "bob", 2, 200, tok) == ([], [])


def test_retrieved_tokens_never_carry_loss(tok):
    bank = FaissBank(bank_config(name="loss"))
    bank.write("the vault code is 4512", policy_id="a")
    ctx, used = retrieve_context(bank, "vault code", "a", 2, 200, tok)
    obs = tok.encode("Enter the code: ", add_special_tokens=False)
    resp = tok.encode("4512", add_special_tokens=False)
    turn = Turn(prompt_ids=ctx + obs, response_ids=resp, logprobs=[0.0] * len(resp),
                memory_ids=used)
    ids, mask, _, _ = Trajectory(turns=[turn]).to_sequence()
    assert ids[: len(ctx)] == ctx and sum(mask[: len(ctx)]) == 0 and sum(mask) == len(resp)
