"""Embedders: the hashing default and the real all-MiniLM-L6-v2 sentence embedder (offline)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from agentrt.memory.config import bank_config
from agentrt.memory.embedders import HashingEmbedder, MiniLMEmbedder, build_embedder
from agentrt.memory.faiss_bank import FaissBank


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b)


def test_hashing_embedder_is_deterministic_normalised_and_lexical():
    texts = ["the door code is 4512", "what is the door code", "bananas are yellow", ""]
    a = HashingEmbedder().encode(texts)
    b = build_embedder("hashing").encode(texts)
    assert a.shape == (4, 256) and a.dtype == np.float32
    assert np.array_equal(a, b)  # crc32, not Python's per-process salted hash
    assert np.allclose(np.linalg.norm(a[:3], axis=1), 1.0, atol=1e-5)
    assert cos(a[0], a[1]) > cos(a[0], a[2])
    assert np.array_equal(HashingEmbedder(dim=64).encode(["door"]).shape, (1, 64))


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    os.environ["HF_HUB_OFFLINE"] = "1"  # prove the weights come from the installed package
    return MiniLMEmbedder(batch_size=4)


def test_minilm_embeds_meaning_in_batches(minilm):
    texts = [
        "A man is playing a guitar.",
        "Someone performs music on a stringed instrument.",
        "The stock market fell sharply today.",
        "The opponent always bluffs when holding a weak hand.",
        "That player often pretends to be strong with bad cards.",
        "Fresh bread is baked every morning.",
    ]
    emb = minilm.encode(texts)
    assert emb.shape == (6, 384) and np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert cos(emb[0], emb[1]) > cos(emb[0], emb[2]) + 0.2
    assert cos(emb[3], emb[4]) > cos(emb[3], emb[5]) + 0.2
    # Batch encoding (padding across texts of different lengths) equals one-by-one encoding.
    single = np.stack([minilm.encode([t])[0] for t in texts])
    assert np.allclose(emb, single, atol=1e-5)


def test_bank_with_minilm_finds_paraphrases(minilm):
    bank = FaissBank(bank_config(name="m", embedder="minilm"), embedder=minilm)
    bank.write_many([
        {"text": "The treasure is hidden under the old oak tree.", "policy_id": "p"},
        {"text": "Bob tends to fold whenever the bet is large.", "policy_id": "p"},
        {"text": "Water boils at one hundred degrees Celsius.", "policy_id": "p"},
    ])
    hit = bank.query("Where did they bury the gold?", k=1)[0]
    assert "treasure" in hit.record.text
    hit = bank.query("How does Bob react to big raises?", k=1)[0]
    assert "Bob" in hit.record.text
