"""The one device rule: a tensor is made where the module that reads it lives.

Every path that feeds a module (the HF rollout's inputs, the trainer's passes, serving, the
async rollout's copies, reward models, memory embedders) asks the *module* for its device with
:func:`module_device` and autocasts on that device's type with :func:`autocast_for`, instead of
assuming the CPU. ``model.device: auto`` (and every other ``auto`` device setting) resolves with
:func:`resolve_device`, the same at config validation and at run time.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from agentrt.core.errors import ConfigError


def resolve_device(name: str, field: str = "model.device") -> torch.device:
    """``auto`` is CUDA when torch sees a GPU, else CPU; ``cuda`` without a GPU is a ConfigError
    naming ``field``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{field} is {name!r} but torch sees no GPU; set {field}: cpu or auto")
    return torch.device(name)


def module_device(module: Any) -> torch.device:
    """The device of ``module``'s first parameter (or buffer); CPU for one with neither."""
    for tensors in (module.parameters(), module.buffers()):
        for t in tensors:
            return t.device
    return torch.device("cpu")


def autocast_for(where: Any, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Autocast to ``dtype`` on the device type of ``where`` (a module or a device); a no-op
    context when ``dtype`` is None (fp32)."""
    if dtype is None:
        return contextlib.nullcontext()
    device = where if isinstance(where, torch.device) else module_device(where)
    return torch.autocast(device.type, dtype=dtype)
