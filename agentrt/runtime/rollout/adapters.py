"""LoRA adapters of many policies served from one rollout engine: names, versions, residency.

Each policy (or frozen snapshot) that shares the engine's base model is one named adapter. The
registry gives it a stable integer id, writes each new version of its weights to a fresh folder,
and keeps at most ``capacity`` adapters loaded in the engine, evicting the least recently used.
An evicted adapter stays registered: the next request that routes to it loads it again from its
folder. The engine itself is reached only through the ``load``/``unload`` callbacks, so this
bookkeeping is plain Python.

Why a fresh folder per version: vLLM keys its prefix cache on (adapter name, adapter path), so a
new path invalidates exactly that adapter's cached prefixes and leaves every other adapter's
cache warm (a global prefix-cache reset would throw those away too).
"""

from __future__ import annotations

import json
import shutil
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


@dataclass
class Adapter:
    """One registered adapter.

    Attributes:
        name: Policy or snapshot name that requests route by.
        int_id: Engine-side id (stable for the adapter's lifetime, >= 1).
        path: Folder in PEFT format (``adapter_config.json`` + ``adapter_model.safetensors``).
        version: Weight version of the policy that wrote ``path``.
        owned: True when the registry wrote ``path`` (and deletes it when replaced).
    """

    name: str
    int_id: int
    path: Path
    version: int
    owned: bool


def write_adapter(folder: Path, tensors: Mapping[str, torch.Tensor],
                  config: Mapping[str, Any]) -> Path:
    """Writes a PEFT-format adapter folder from a state dict and a LoraConfig dict.

    Args:
        folder: Target folder (created).
        tensors: PEFT adapter state dict, e.g. from ``peft.get_peft_model_state_dict``; names like
            ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``.
        config: ``peft.LoraConfig.to_dict()`` (sets are written as lists).
    """
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()},
              str(folder / ADAPTER_WEIGHTS))
    cfg = {k: (sorted(v) if isinstance(v, set) else v) for k, v in dict(config).items()}
    (folder / ADAPTER_CONFIG).write_text(json.dumps(cfg, default=str, indent=1))
    return folder


def peft_config_dict(config: Any) -> dict[str, Any]:
    """A JSON-able dict of a ``peft.LoraConfig`` (or a dict already)."""
    data = dict(config) if isinstance(config, Mapping) else config.to_dict()
    data = {k: (sorted(v) if isinstance(v, set) else v) for k, v in data.items()}
    data.setdefault("peft_type", "LORA")
    return data


class AdapterRegistry:
    """Named, versioned adapters with at most ``capacity`` resident in the engine (LRU).

    Args:
        root: Folder where adapter versions are written (a RAM disk such as /dev/shm is best).
        capacity: Most adapters loaded in the engine at once.
        load: ``load(adapter, replace)`` loads ``adapter`` into the engine; ``replace`` is True
            when an adapter of the same id is resident and must be replaced in place.
        unload: ``unload(adapter)`` removes it from the engine.
    """

    def __init__(self, root: Path, capacity: int, load: Callable[[Adapter, bool], None],
                 unload: Callable[[Adapter], None]) -> None:
        if capacity < 1:
            raise ValueError("adapter capacity must be at least 1")
        self.root = Path(root)
        self.capacity = capacity
        self._load = load
        self._unload = unload
        self._adapters: dict[str, Adapter] = {}
        self._resident: OrderedDict[str, None] = OrderedDict()  # oldest first
        self._next_id = 1
        self._writes = 0
        self.evictions = 0
        self.loads = 0

    # ------------------------------------------------------------------ queries
    def __contains__(self, name: object) -> bool:
        return name in self._adapters

    def get(self, name: str) -> Adapter:
        if name not in self._adapters:
            known = ", ".join(sorted(self._adapters)) or "none"
            raise KeyError(f"no adapter named {name!r} is registered (registered: {known})")
        return self._adapters[name]

    @property
    def names(self) -> list[str]:
        return sorted(self._adapters)

    @property
    def resident(self) -> list[str]:
        """Resident adapter names, least recently used first."""
        return list(self._resident)

    # ------------------------------------------------------------------ changes
    def register(self, name: str, source: str | Path | Mapping[str, torch.Tensor],
                 config: Any = None, version: int = 0) -> Adapter:
        """Adds a new adapter from a PEFT folder or from tensors + LoraConfig (not loaded yet)."""
        if name in self._adapters:
            raise ValueError(f"adapter {name!r} is already registered; use update_adapter")
        adapter = Adapter(name, self._next_id, Path(), version, owned=False)
        self._next_id += 1
        adapter.path, adapter.owned = self._materialise(adapter, source, config, version)
        self._adapters[name] = adapter
        return adapter

    def update(self, name: str, source: str | Path | Mapping[str, torch.Tensor],
               config: Any = None, version: int | None = None) -> Adapter:
        """New weights for ``name``; replaced in place in the engine if resident."""
        adapter = self.get(name)
        version = adapter.version + 1 if version is None else version
        if config is None and not isinstance(source, (str, Path)):
            config = json.loads((adapter.path / ADAPTER_CONFIG).read_text())
        old_path, old_owned = adapter.path, adapter.owned
        adapter.path, adapter.owned = self._materialise(adapter, source, config, version)
        adapter.version = version
        if name in self._resident:
            self._load(adapter, True)
            self.loads += 1
            self._resident.move_to_end(name)
        if old_owned and old_path != adapter.path:
            shutil.rmtree(old_path, ignore_errors=True)
        return adapter

    def remove(self, name: str) -> None:
        adapter = self.get(name)
        if name in self._resident:
            self._unload(adapter)
            del self._resident[name]
        if adapter.owned:
            shutil.rmtree(adapter.path, ignore_errors=True)
        del self._adapters[name]

    def acquire(self, names: Iterable[str]) -> list[Adapter]:
        """Makes ``names`` resident (evicting least recently used others) and marks them used.

        Raises:
            ValueError: More distinct names than ``capacity`` (split the batch first).
        """
        wanted = list(dict.fromkeys(names))
        if len(wanted) > self.capacity:
            raise ValueError(f"{len(wanted)} adapters requested at once but at most "
                             f"{self.capacity} can be resident")
        adapters = [self.get(n) for n in wanted]
        for adapter in adapters:
            if adapter.name in self._resident:
                self._resident.move_to_end(adapter.name)
                continue
            while len(self._resident) >= self.capacity:
                victim = next(n for n in self._resident if n not in wanted)
                self._unload(self._adapters[victim])
                del self._resident[victim]
                self.evictions += 1
            self._load(adapter, False)
            self.loads += 1
            self._resident[adapter.name] = None
        return adapters

    def _materialise(self, adapter: Adapter, source: str | Path | Mapping[str, torch.Tensor],
                     config: Any, version: int) -> tuple[Path, bool]:
        if isinstance(source, (str, Path)):
            folder = Path(source)
            if not (folder / ADAPTER_CONFIG).is_file():
                raise FileNotFoundError(f"adapter folder {str(folder)!r} has no {ADAPTER_CONFIG}")
            return folder, False
        if config is None:
            raise ValueError(f"adapter {adapter.name!r}: tensors need their LoraConfig")
        # A write counter keeps every path unique even if a version number is written twice, so
        # a cached prefix can never be matched against different weights.
        self._writes += 1
        folder = self.root / f"{adapter.int_id:04d}" / f"v{version}-{self._writes}"
        return write_adapter(folder, source, peft_config_dict(config)), True
