"""The C++ compiler that ``torch.compile`` needs, found without importing torch.

Inductor writes C++ (CPU) or a C launcher (Triton, GPU) and builds it with the compiler named
by ``CXX``, else ``g++`` (``torch._inductor.config.cpp.cxx``); without one the first compiled
call fails deep inside inductor. A config that asks for ``compile: true`` is checked before the
run starts instead (:func:`require_compiler`). The rollout's C++ attention kernel
(agentrt.runtime.rollout.kernels) needs a compiler too, but falls back to SDPA without one.
"""

from __future__ import annotations

import os
import shutil

from agentrt.core.errors import ConfigError


def cxx_compiler() -> str | None:
    """The path of the compiler inductor would run (``$CXX``, else ``g++``), or None."""
    return shutil.which(os.environ.get("CXX") or "g++")


def extension_compiler() -> str | None:
    """The path of the compiler torch's C++ extension loader runs (``$CXX``, else ``c++``), or
    None."""
    return shutil.which(os.environ.get("CXX") or "c++")


def require_compiler(field: str) -> None:
    """Raises one :class:`ConfigError` line for ``field`` (a ``compile: true``) when
    :func:`cxx_compiler` finds none."""
    if cxx_compiler() is not None:
        return
    named = (f"CXX={os.environ['CXX']!r} was not found" if os.environ.get("CXX") else
             "no g++ is on PATH")
    raise ConfigError(f"{field}: torch.compile builds C++ and needs a C++ compiler, but {named}"
                      "; install one (`make system-packages`, or apt-get install g++) "
                      "or set compile: false")
