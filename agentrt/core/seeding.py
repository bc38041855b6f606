"""Random-number-generator states as plain data (lists, dicts, ints, floats, str).

Checkpoints hold nothing but tensors and plain data, so they load with
``torch.load(weights_only=True)`` (a checkpoint cannot run code): python's and numpy's generator
states go in through these converters instead of as tuples holding numpy arrays or as pickled
generator objects. No torch here: scripted policies use it in config checks, which stay light.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np


def random_state(rng: random.Random | None = None) -> list[Any]:
    """``rng``'s state (default: the ``random`` module's) as ``[version, [625 ints], gauss]``."""
    version, key, gauss = (random if rng is None else rng).getstate()
    return [version, list(key), gauss]


def set_random_state(state: list[Any], rng: random.Random | None = None) -> None:
    """Restores a :func:`random_state` into ``rng`` (default: the ``random`` module)."""
    version, key, gauss = state
    (random if rng is None else rng).setstate((int(version), tuple(int(k) for k in key), gauss))


def numpy_state() -> dict[str, Any]:
    """numpy's global (legacy ``np.random``) generator state, the key as a list of ints."""
    name, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return {"bit_generator": str(name), "key": key.tolist(), "pos": int(pos),
            "has_gauss": int(has_gauss), "gauss": float(gauss)}


def set_numpy_state(state: dict[str, Any]) -> None:
    """Restores a :func:`numpy_state`."""
    np.random.set_state((state["bit_generator"], np.asarray(state["key"], dtype=np.uint32),
                         int(state["pos"]), int(state["has_gauss"]), float(state["gauss"])))
