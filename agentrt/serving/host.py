"""The weights a server holds: named models, each at a version, loaded over the rollout backends.

Every served name points at its current :class:`Version`. A request *binds* the current version
when it is admitted (:meth:`ModelHost.acquire`) and releases it when it is answered, so a hot swap
(:meth:`ModelHost.stage` then :meth:`ModelHost.commit`) never changes the weights under a request:
requests admitted before the swap are generated with the old version, which stays loaded until
the last of them is answered, and every request admitted after it gets the new one.

Adapters over one base share that base in memory: with the HF backend one peft model holds every
adapter version as a named adapter; with vLLM one engine serves them, routed
per request. A full-weight model's new version is a second module (or engine) while the old one
drains. Everything that touches a module runs on the batcher's thread, never beside a generate
call; only a fresh full-weight module is built on the admin request's thread.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from agentrt.config.rollout import SamplingConfig, VLLMConfig
from agentrt.core.device import resolve_device
from agentrt.core.errors import AgentrtError
from agentrt.runtime.rollout.hf import Completion, HFRollout
from agentrt.serving.sources import ADAPTER_CONFIG, Source, source_of

OnStep = Callable[[list[int]], None]  # one new token id per batch row, after each decode step


class _Streamer:
    """transformers' streamer protocol: ``put`` gets the prompt ids once, then each step's ids."""

    def __init__(self, on_step: OnStep) -> None:
        self.on_step, self.prompt_seen = on_step, False

    def put(self, value: torch.Tensor) -> None:
        if self.prompt_seen:
            self.on_step(value.reshape(-1).tolist())
        self.prompt_seen = True

    def end(self) -> None:
        pass


class Module:
    """One model in memory (HF module or vLLM engine) and the adapters loaded on it."""

    def __init__(self, path: Path, backend: str, max_batch: int, lora_rank: int | None,
                 vllm: VLLMConfig | None, device: torch.device) -> None:
        from transformers import AutoTokenizer

        self.path, self.backend, self.users, self.device = path, backend, 0, device
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.lora_rank = lora_rank
        if backend == "vllm":
            from agentrt.runtime.rollout.vllm_backend import VLLMRollout

            self.vllm = VLLMRollout(path, vllm or VLLMConfig(), lora_rank=lora_rank)
            self.max_len = self.vllm.cfg.max_model_len
            return
        from agentrt.policies.models import load_model

        model, _ = load_model(path)
        self.model = model.to(device).eval()  # the rollout makes its inputs on this device
        self.max_len = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.rollout = HFRollout(self.model, self.tokenizer, SamplingConfig(), max_batch)

    def add_adapter(self, key: str, folder: Path) -> None:
        if self.backend == "vllm":
            rank = json.loads((folder / ADAPTER_CONFIG).read_text()).get("r", 0)
            if self.lora_rank is None or rank > self.lora_rank:
                raise AgentrtError(f"adapter {folder} has rank {rank} but the vLLM engine of "
                                   f"{self.path} serves ranks up to {self.lora_rank}; restart "
                                   "the server with it")
            self.vllm.add_adapter(key, folder)
            return
        from peft import PeftModel

        if isinstance(self.model, PeftModel):
            self.model.load_adapter(str(folder), adapter_name=key)
        else:
            self.model = PeftModel.from_pretrained(self.model, str(folder), adapter_name=key)
            self.model.eval()
            self.rollout = HFRollout(self.model, self.tokenizer, SamplingConfig(),
                                     self.rollout.batch_size)
        self.model.to(self.device)  # the new adapter's tensors beside the base's

    def drop_adapter(self, key: str) -> None:
        if self.backend == "vllm":
            self.vllm.remove_adapter(key)
        else:
            self.model.delete_adapter(key)

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, adapter: str | None,
                 on_step: OnStep | None) -> list[Completion]:
        if self.backend == "vllm":  # no token stream from the engine: replay steps after it
            out = self.vllm.generate(prompts, sampling, adapters=adapter)
            if on_step is not None:
                for step in range(max(len(c.response_ids) for c in out)):
                    on_step([c.response_ids[step] if step < len(c.response_ids)
                             else self.rollout_pad for c in out])
            return out
        streamer = _Streamer(on_step) if on_step is not None else None
        if adapter is None and hasattr(self.model, "disable_adapter"):
            with self.model.disable_adapter():
                return self.rollout.generate(prompts, sampling, streamer=streamer)
        if adapter is not None:
            self.model.set_adapter(adapter)
        return self.rollout.generate(prompts, sampling, streamer=streamer)

    @property
    def rollout_pad(self) -> int:
        return int(self.tokenizer.pad_token_id)

    def close(self) -> None:
        if self.backend == "vllm":
            self.vllm.close()


@dataclass(eq=False)
class Version:
    """One version of a served name's weights.

    Attributes:
        name: The served name (a request's ``model``).
        number: 0 at start, one more at every swap.
        source: Where the weights came from.
        module: The module that computes it.
        adapter: Its adapter key on ``module``; None: the module's own weights.
        users: Admitted requests not answered yet.
    """

    name: str
    number: int
    source: Source
    module: Module
    adapter: str | None
    users: int = field(default=0)

    @property
    def fingerprint(self) -> str:
        return f"agentrt-{self.name}-v{self.number}"


@dataclass
class Staged:
    """A new version prepared off the batcher thread, waiting for :meth:`ModelHost.commit`."""

    source: Source
    module: Module | None  # a fresh full-weight module; None: an adapter on the current base


class ModelHost:
    """Served names, their current versions and the modules that compute them.

    Args:
        sources: What to serve.
        backend: "hf" (transformers generate) or "vllm".
        max_batch: Most prompts in one generate call.
        vllm: Engine settings of the vLLM backend.
        device: Where the HF backend's models run: auto (CUDA when torch sees a GPU), cpu or
            cuda (``--device``).
    """

    def __init__(self, sources: Sequence[Source], backend: str = "hf", max_batch: int = 32,
                 vllm: VLLMConfig | None = None, device: str = "auto") -> None:
        self.backend, self.max_batch, self.vllm_cfg = backend, max_batch, vllm
        self.device = resolve_device(device, "--device")
        self._lock = threading.Lock()
        self._bases: dict[Path, Module] = {}
        self._adapters = 0
        ranks: dict[Path, int] = {}
        for s in sources:
            if s.base is not None:
                rank = json.loads((s.path / ADAPTER_CONFIG).read_text()).get("r", 8)
                ranks[s.base.resolve()] = max(ranks.get(s.base.resolve(), 0), int(rank))
        self._ranks = ranks
        self.current: dict[str, Version] = {}
        self.candidates: dict[str, Version] = {}  # a canary's version beside the current one
        self._numbers: dict[str, int] = {}  # the last version number given per name
        self._live: list[Version] = []  # current, candidate and draining versions
        for s in sources:
            self.current[s.name] = self._attach(Staged(s, None), 0)

    def probe_model(self) -> torch.nn.Module | None:
        """The first base model loaded with the HF backend (thread tuning times it), if any."""
        for module in self._bases.values():
            if isinstance(getattr(module, "model", None), torch.nn.Module):
                return module.model
        return None

    def _base(self, path: Path) -> Module:
        key = path.resolve()
        if key not in self._bases:
            self._bases[key] = Module(path, self.backend, self.max_batch, self._ranks.get(key),
                                      self.vllm_cfg, self.device)
        return self._bases[key]

    def _attach(self, staged: Staged, number: int) -> Version:
        s = staged.source
        if s.base is None:
            module = staged.module or self._base(s.path)
            version = Version(s.name, number, s, module, None)
        else:
            module = self._base(s.base)
            self._adapters += 1  # peft adapter names may not hold '.'; served names may
            key = f"served{self._adapters}"
            module.add_adapter(key, s.path)
            version = Version(s.name, number, s, module, key)
        module.users += 1
        with self._lock:
            self._live.append(version)
            self._numbers[s.name] = number
        return version

    # ------------------------------------------------------------------ requests
    def acquire(self, name: str, count: int = 1, candidate: bool = False) -> Version:
        """Binds ``count`` prompts of an admitted request to ``name``'s current version (each
        released once), or to its canary candidate. Raises KeyError."""
        with self._lock:
            version = (self.candidates if candidate else self.current)[name]
            version.users += count
            return version

    def release(self, version: Version) -> None:
        """A request bound to ``version`` is answered; a replaced version with no request left
        is unloaded (call on the batcher thread)."""
        with self._lock:
            version.users -= 1
            drained = version.users == 0 and self.current.get(version.name) is not version
        if drained:
            self._unload(version)

    def tokenizer(self, name: str) -> Any:
        return self.current[name].module.tokenizer

    def max_len(self, name: str) -> int:
        return self.current[name].module.max_len

    # ------------------------------------------------------------------ hot swap
    def stage(self, name: str, path: Path) -> Staged:
        """Checks and prepares new weights for ``name`` (any thread): a full-weight model is
        loaded here; an adapter is loaded by :meth:`commit`. Raises AgentrtError."""
        if name not in self.current:
            raise AgentrtError(f"no served model is named {name!r}; served: "
                               f"{', '.join(sorted(self.current))}")
        old = self.current[name].source
        source = source_of(name, path, old.base)
        if (source.base is None) != (old.base is None):
            kinds = ("a full model", "a LoRA adapter")
            now, new = (kinds[old.base is not None], kinds[source.base is not None])
            raise AgentrtError(f"{name!r} serves {now} but {path} holds {new}; swap in "
                               f"{now} (or serve {new} under another name)")
        if source.base is not None:
            return Staged(source, None)
        return Staged(source, Module(path, self.backend, self.max_batch, None, self.vllm_cfg,
                                     self.device))

    def commit(self, staged: Staged) -> Version:
        """Makes staged weights the current version of their name (call on the batcher
        thread); the old version is unloaded once its last request is answered."""
        return self.promote(self._attach(staged, self._numbers[staged.source.name] + 1))

    def add_candidate(self, staged: Staged) -> Version:
        """Loads staged weights as ``name``'s canary candidate beside its current version (call
        on the batcher thread); it stays loaded until :meth:`promote` or :meth:`withdraw`."""
        name = staged.source.name
        if name in self.candidates:
            raise AgentrtError(f"{name!r} has a candidate already")
        new = self._attach(staged, self._numbers[name] + 1)
        with self._lock:
            new.users += 1  # the canary's hold, released by promote or withdraw
            self.candidates[name] = new
        return new

    def withdraw(self, candidate: Version) -> None:
        """Rolls a candidate back: unloaded once its last request is answered (batcher thread)."""
        with self._lock:
            del self.candidates[candidate.name]
        self.release(candidate)

    def promote(self, new: Version) -> Version:
        """Makes a loaded version (a candidate) its name's current one (batcher thread)."""
        name = new.name
        with self._lock:
            if self.candidates.get(name) is new:
                del self.candidates[name]
                new.users -= 1  # the canary's hold
            old, self.current[name] = self.current[name], new
            drained = old.users == 0
        if drained:
            self._unload(old)
        return new

    def _unload(self, version: Version) -> None:
        module = version.module
        if version.adapter is not None:
            module.drop_adapter(version.adapter)
        module.users -= 1
        with self._lock:
            self._live.remove(version)
        if module.users == 0:
            self._bases = {k: m for k, m in self._bases.items() if m is not module}
            module.close()

    def versions(self) -> list[dict[str, Any]]:
        """Loaded versions (current and draining), for /v1/models and /admin/versions."""
        with self._lock:
            return [{"model": v.name, "version": v.number, "fingerprint": v.fingerprint,
                     "path": str(v.source.path),
                     "base": str(v.source.base) if v.source.base else None,
                     "current": self.current.get(v.name) is v,
                     "candidate": self.candidates.get(v.name) is v, "pending": v.users}
                    for v in self._live]

    def close(self) -> None:
        for module in {id(v.module): v.module for v in self._live}.values():
            module.close()
