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


def find_compiler(default: str = "g++") -> str | None:
    """The path of ``$CXX``, else of ``default`` (inductor runs ``g++``, torch's C++ extension
    loader ``c++``), or None."""
    return shutil.which(os.environ.get("CXX") or default)


def missing(default: str = "g++") -> str:
    """Why :func:`find_compiler` found none, for an error line."""
    cxx = os.environ.get("CXX")
    return f"CXX={cxx!r} was not found" if cxx else f"no {default} is on PATH"


def require_compiler(field: str) -> None:
    """Raises one :class:`ConfigError` line for ``field`` (a ``compile: true``) when
    :func:`find_compiler` finds none."""
    if find_compiler() is None:
        raise ConfigError(f"{field}: torch.compile builds C++ and needs a C++ compiler, but "
                          f"{missing()}; install one (`make system-packages`, or apt-get "
                          "install g++) or set compile: false")
