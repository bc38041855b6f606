"""Policy pools: the API a controller drives one policy (or several LoRA policies) through.

A pool hosts one full-weight policy, or several LoRA policies over one shared base model, on N
data-parallel workers (:class:`~agentrt.runtime.worker.PolicyWorker`).
:class:`~agentrt.runtime.ray_pool.PolicyPool` runs them as Ray actors in a placement group
(gradients all-reduced over gloo); :class:`LocalPool` runs one in this process, no Ray (tests,
bench baseline, ``runtime.backend: local``). Same API (stable; the tournament controller calls
exactly this; docs/runtime.md)::

    pool.generate(prompts, sampling=None, adapter=None) -> list[Completion]   # order preserved
    pool.train(trajectories, adapter=None) -> dict[str, float]                # one RL step
    pool.version / pool.version_of(adapter) ; pool.snapshot(adapter, tag) -> "adapter@tag"
    pool.state_dict() / pool.load_state_dict(state) ; pool.shutdown()

``train`` collates here, has every worker ``prepare`` its rows, computes advantages *once* on the
whole batch here (group baselines need the whole batch; "rae" must see each batch once), then
every worker updates on its share of each mini-batch with gradients summed over workers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentrt.algos.rae import RAEState
from agentrt.config.rollout import SamplingConfig
from agentrt.config.sections import PolicyConfig, SFTConfig
from agentrt.runtime.learner import Learner
from agentrt.runtime.rollout.hf import Completion
from agentrt.runtime.steps import advantages_from
from agentrt.core.types import Trajectory, collate
from agentrt.runtime.shared_model import ModuleCopy, model_folder
from agentrt.runtime.worker import PolicyWorker, gather_prepared, split_rows

log = logging.getLogger(__name__)


# Picks the worker method a pool calls, ``lambda w: w.update``: ``w`` is the PolicyWorker itself
# in-process, its actor handle on Ray (whose method the pool then calls with ``.remote``).
WorkerMethod = Callable[[PolicyWorker], Callable[..., Any]]
_GLOBAL_RNG = threading.Lock()  # local pools take turns with torch's global generator


def resolve_model(cfg: PolicyConfig, workdir: str | Path | None, seed: int) -> PolicyConfig:
    """``cfg`` with ``model.path`` set: a preset is built once here (as the learner would), so
    workers load one folder instead of racing to build it."""
    if cfg.model.path is not None:
        return cfg
    folder = model_folder(cfg, workdir, seed)
    return cfg.model_copy(update={"model": cfg.model.model_copy(
        update={"path": str(folder), "preset": None})})


class BasePool:
    """Driver-side logic of both pools; subclasses supply the transport (``_call_each``)."""

    num_workers: int = 1

    def __init__(self, policies: list[PolicyConfig]) -> None:
        if not policies:
            raise ValueError("a pool needs at least one policy")
        self.policies = {p.id: p for p in policies}
        self.cfg = policies[0]
        self.rae = {p.id: RAEState.for_algorithm(p.algorithm) for p in policies}
        self.versions: dict[str, int] = {p.id: 0 for p in policies}
        self.lagging = False  # an async rollout generates with older weights (rollout_copy)
        self.tokenizer: Any = None
        self._lock = threading.RLock()  # one call at a time per pool (controller threads)

    # ------------------------------------------------------------------ transport (subclasses)
    def _call_each(self, method: WorkerMethod, args: list[tuple]) -> list[Any]:
        """Calls ``method(worker_i)(*args[i])`` for every worker ``i`` (as many workers as
        ``args``); results in order."""
        raise NotImplementedError

    def _put(self, obj: Any) -> Any:
        """Ships a large argument once for all workers (``ray.put`` for Ray)."""
        return obj

    def _call(self, method: WorkerMethod, *args: Any) -> list[Any]:
        """Calls ``method(worker)(*args)`` on every worker; results in order."""
        return self._call_each(method, [args] * self.num_workers)

    def _guarded(self, impl: Callable[..., Any], *args: Any, journal: bool = True) -> Any:
        """``impl(*args)``, one call at a time. The Ray pool retries it after restarting lost
        workers and, with ``journal`` (every call that changes state; reads pass False), keeps
        ``(impl, args)`` to replay after a later restart. Sampling is such a call (it moves the
        workers' torch RNG): replayed, a restarted worker samples what the lost one would."""
        with self._lock:
            return impl(*args)

    # ------------------------------------------------------------------ learner-like facade
    @property
    def policy_id(self) -> str:
        return self._name(None)

    @property
    def version(self) -> int:
        """Version of the pool's only policy (``version_of`` names one of several)."""
        return self.versions[self._name(None)]

    def version_of(self, adapter: str) -> int:
        return self.versions[adapter]

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    @property
    def eos_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    def _name(self, adapter: str | None) -> str:
        if adapter is not None:
            if adapter not in self.versions:
                raise KeyError(f"pool has no policy or snapshot {adapter!r}; "
                               f"have {sorted(self.versions)}")
            return adapter
        if len(self.policies) != 1:
            raise ValueError(f"this pool hosts {sorted(self.policies)}; pass adapter=")
        return next(iter(self.policies))

    # ------------------------------------------------------------------ public API
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig | None = None,
                 adapter: str | None = None) -> list[Completion]:
        """One completion per prompt; prompts are split across workers, order preserved."""
        return self._guarded(self._generate, prompts, sampling, self._name(adapter))

    def generate_many(self, requests: list[tuple[list[list[int]], SamplingConfig | None,
                                                  str | None]]) -> list[list[Completion]]:
        """:meth:`generate` of each ``(prompts, sampling, adapter)``, in one call per worker: the
        pool's policies and snapshots decode as one batch where the model allows it
        (:meth:`~agentrt.runtime.shared_model.SharedModel.generate_many`)."""
        return self._guarded(self._generate_many,
                             [(prompts, sampling, self._name(adapter))
                              for prompts, sampling, adapter in requests])

    def train(self, trajectories: list[Trajectory], adapter: str | None = None
              ) -> dict[str, float]:
        """One RL step of ``adapter`` (the only policy when None) on ``trajectories``."""
        return self._guarded(self._train, trajectories, self._trainable(adapter))

    def sft_step(self, trajectories: list[Trajectory], sft: SFTConfig,
                 adapter: str | None = None) -> dict[str, float]:
        """One supervised step on demonstrations (loss on the response tokens)."""
        return self._guarded(self._sft_step, trajectories, sft, self._trainable(adapter))

    def end_sft(self, adapter: str | None = None) -> None:
        """Ends the warm start: drops the SFT optimizer; the policy's version restarts at 0."""
        self._guarded(self._end_sft, self._trainable(adapter))

    def preference_step(self, examples: list[Any], pairs: str = "all",
                        adapter: str | None = None) -> dict[str, float]:
        """One preference-loss step (dpo, ipo, kto, listwise) on ``examples``; those without
        reference log-probs get them from the policy's reference first."""
        return self._guarded(self._preference_step, examples, pairs, self._trainable(adapter))

    def fill_reference(self, examples: list[Any], adapter: str | None = None) -> list[Any]:
        """``examples`` with reference log-probs of the policy as it stands now (offline data)."""
        return self._guarded(self._fill_reference, examples, self._trainable(adapter),
                             journal=False)

    def preference_eval(self, examples: list[Any], adapter: str | None = None
                        ) -> dict[str, float]:
        """Held-out preference accuracy and margin (from worker 0)."""
        return self._guarded(self._preference_eval, examples, self._trainable(adapter),
                             journal=False)

    def sequence_logprobs(self, prompts: list[list[int]], responses: list[list[int]],
                          adapter: str | None = None) -> list[float]:
        """Summed log-prob of each response after its prompt (agentrt.runtime.scoring); sharded:
        every worker computes it (each pass is a collective), else worker 0."""
        calls = self.num_workers if self.cfg.resources.sharding == "fsdp" else 1
        return self._guarded(self._call_each, lambda w: w.sequence_logprobs,
                             [(prompts, responses, self._name(adapter))] * calls, journal=False)[0]

    def reconfigure(self, cfg: PolicyConfig) -> None:
        """A live change of ``cfg.id``'s sampling or LR (agentrt.controller.control)."""
        self._guarded(self._reconfigure, cfg, self._trainable(cfg.id))

    def snapshot(self, adapter: str, tag: str) -> str:
        """Freezes policy ``adapter`` as ``"<adapter>@<tag>"`` (returned), which keeps its weights
        and version while the source trains on (LoRA: one more adapter; else a CPU copy)."""
        return self._guarded(self._snapshot, self._trainable(adapter), str(tag))

    def drop_snapshot(self, name: str) -> None:
        """Frees a snapshot (it left the league)."""
        if name in self.policies:
            raise ValueError(f"{name!r} is a policy, not a snapshot")
        self._guarded(self._drop_snapshot, self._name(name))

    def reset_to(self, adapter: str, snapshot: str) -> None:
        """Loads ``snapshot``'s weights into policy ``adapter`` (a league exploiter's reset)."""
        self._guarded(self._reset_to, self._trainable(adapter), self._name(snapshot))

    def weights(self, adapter: str | None = None) -> dict[str, torch.Tensor]:
        """Trainable weights of a policy or snapshot, from worker 0 (adapter only for LoRA)."""
        return self._guarded(self._call_each, lambda w: w.trainable_state,
                             [(self._name(adapter),)], journal=False)[0]

    def save_pretrained(self, folder: str | Path, adapter: str | None = None) -> Path:
        """Writes the policy in Hugging Face format from worker 0 (``folder``: visible to it)."""
        return Path(self._guarded(self._call_each, lambda w: w.save_pretrained,
                                  [(str(folder), self._name(adapter))], journal=False)[0])

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint: every policy's learner state (with this driver's RAE baselines), snapshot
        weights, and each worker's torch RNG (``rng``, one per worker)."""
        with self._lock:
            parts = self._guarded(self._call_each, lambda w: w.state_dict,  # retried if lost
                                  [(i == 0,) for i in range(self.num_workers)], journal=False)
            state = parts[0]
            state["rng"] = [p["rng"] for p in parts]
            for name, eng_state in state["policies"].items():
                eng_state["rae_state"] = self.rae[name].state_dict()
            self._checkpointed(state)
            return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self._load(state)
            self._checkpointed(state)

    def shutdown(self) -> None:
        """Releases the workers (no-op in-process)."""

    # ------------------------------------------------------------------ implementations
    def _trainable(self, adapter: str | None) -> str:
        name = self._name(adapter)
        if name not in self.policies:
            raise ValueError(f"{name!r} is a frozen snapshot; train its source policy instead")
        return name

    def _generate(self, prompts: list[list[int]], sampling: SamplingConfig | None,
                  name: str) -> list[Completion]:
        parts = [rows for rows in split_rows(len(prompts), self.num_workers)
                 if rows.stop > rows.start]
        outs = self._call_each(lambda w: w.generate, [(prompts[r], sampling, name) for r in parts])
        return [c for out in outs for c in out]

    def _generate_many(self, requests: list[tuple[list[list[int]], SamplingConfig | None, str]]
                       ) -> list[list[Completion]]:
        # each request split over the workers as _generate splits it; worker i gets its part of
        # every request
        parts = [split_rows(len(prompts), self.num_workers) for prompts, _, _ in requests]
        outs = self._call_each(lambda w: w.generate_many, [
            ([(prompts[rows[i]], sampling, name)
              for (prompts, sampling, name), rows in zip(requests, parts)],)
            for i in range(self.num_workers)])
        return [[c for out in outs for c in out[j]] for j in range(len(requests))]

    def _train(self, trajectories: list[Trajectory], name: str) -> dict[str, float]:
        algo = self.policies[name].algorithm
        start = time.perf_counter()
        batch = collate(trajectories, self.pad_id)
        older = any(t.policy_version < self.versions[name] for t in trajectories)
        if self.lagging:  # sampled by older weights: the ratio's old log-probs must be the
            # sampling (behaviour) policy's, the rollout's, not the learner's current ones
            batch.stale = older
        else:  # replayed rows: recomputed with the current weights (docs/control.md)
            batch.replayed = older
        self._check_split(batch.size, algo.mini_batches, name)
        ref = self._put(batch)
        prepared = self._call_each(lambda w: w.prepare, [
            (ref, rows, name) for rows in split_rows(batch.size, self.num_workers)])
        metrics = gather_prepared(batch, prepared)
        metrics["timing_s/prepare"] = time.perf_counter() - start
        metrics |= advantages_from(batch, algo, prepared[0].kl_coef, self.rae[name])
        start = time.perf_counter()
        metrics |= self._call(lambda w: w.update, self._put(batch), name)[0]  # same on all
        metrics["timing_s/update"] = time.perf_counter() - start
        metrics["perf/train_tokens"] = float(batch.num_tokens)
        self.versions[name] += 1
        return metrics

    def _sft_step(self, trajectories: list[Trajectory], sft: SFTConfig, name: str
                  ) -> dict[str, float]:
        batch = collate(trajectories, self.pad_id)
        self._check_split(batch.size, 1, name)
        metrics = self._call(lambda w: w.sft_step, self._put(batch), sft, name)[0]
        self.versions[name] += 1
        return metrics

    def _reconfigure(self, cfg: PolicyConfig, name: str) -> None:
        # only what may change live: the pool's policy keeps its own (resolved) model fields
        cfg = self.policies[name].model_copy(update={"rollout": cfg.rollout, "optim": cfg.optim})
        self._call(lambda w: w.reconfigure, cfg)
        self.policies[name] = cfg
        if self.cfg.id == name:
            self.cfg = cfg

    def _end_sft(self, name: str) -> None:
        self._call(lambda w: w.end_sft, name)
        self.versions[name] = 0

    def _snapshot(self, name: str, tag: str) -> str:
        snap = self._call(lambda w: w.snapshot, name, tag)[0]
        self.versions[snap] = self.versions[name]
        return snap

    def _drop_snapshot(self, name: str) -> None:
        self._call(lambda w: w.drop_snapshot, name)
        del self.versions[name]

    def _reset_to(self, name: str, snapshot: str) -> None:
        self._call(lambda w: w.reset_to, name, snapshot)

    def _preference_step(self, examples: list[Any], pairs: str, name: str) -> dict[str, float]:
        start = time.perf_counter()
        if self.num_workers > 1 and len(examples) < self.num_workers:
            raise ValueError(f"policy {name!r}: {len(examples)} preference examples for "
                             f"{self.num_workers} workers; train on more examples")
        metrics = self._call(lambda w: w.preference_step, self._put(examples), pairs, name)[0]
        metrics["timing_s/update"] = time.perf_counter() - start
        self.versions[name] += 1
        return metrics

    def _fill_reference(self, examples: list[Any], name: str) -> list[Any]:
        return self._call_each(lambda w: w.fill_reference, [(examples, name)])[0]

    def _preference_eval(self, examples: list[Any], name: str) -> dict[str, float]:
        return self._call_each(lambda w: w.preference_eval, [(examples, name)])[0]

    def _check_split(self, size: int, mini_batches: int, name: str) -> None:
        """Every worker needs >= 1 row of every mini-batch (same shapes in every collective)."""
        width = -(-size // mini_batches)  # the learner's mini-batch size, ceil(size / mini_batches)
        smallest = min(min(width, size - start) for start in range(0, size, width))
        if self.num_workers > 1 and smallest < self.num_workers:
            raise ValueError(
                f"policy {name!r}: {size} trajectories in {mini_batches} mini-batches leave a "
                f"mini-batch of {smallest} rows for {self.num_workers} workers; train on more "
                "trajectories or lower algorithm.mini_batches")

    def _load(self, state: dict[str, Any]) -> None:
        ref = self._put(state)
        self._call_each(lambda w: w.load_state_dict, [(ref, i) for i in range(self.num_workers)])
        for name, eng_state in state["policies"].items():
            self.rae[name] = RAEState.for_algorithm(self.policies[name].algorithm)
            self.rae[name].load_state_dict(eng_state["rae_state"])
            self.versions[name] = int(eng_state["version"])
        for name in [n for n in self.versions if n not in self.policies]:
            del self.versions[name]
        for name, snap in state["snapshots"].items():
            self.versions[name] = int(snap["version"])

    def _checkpointed(self, state: dict[str, Any]) -> None:
        """Hook: the Ray pool keeps ``state`` as its recovery point."""


class LocalPool(BasePool):
    """The pool API over one in-process worker (no Ray): tests, bench baseline, local runs.

    Like a Ray worker process, the pool has its own torch RNG stream: every call (sampling,
    adapter initialisation of a snapshot, dropout in SFT) draws from it and checkpoints save and
    restore it, so several local pools draw what the same pools on Ray draw, whatever order the
    runner calls them in. The stream is swapped into torch's one global generator, so calls of
    different local pools (the controller's threads) take turns.

    Args:
        policies: One policy, or several LoRA policies sharing a base model.
        seed: Initialisation seed (as ``Learner``).
        total_steps: Steps the LR schedules span.
        workdir: Where a preset model is built.
    """

    def __init__(self, policies: PolicyConfig | list[PolicyConfig], seed: int = 0,
                 total_steps: int = 1000, workdir: str | Path | None = None) -> None:
        policies = [policies] if isinstance(policies, PolicyConfig) else list(policies)
        super().__init__(policies)
        with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
            self.worker = PolicyWorker(policies, seed=seed, total_steps=total_steps,
                                       workdir=None if workdir is None else str(workdir))
            self._rng = torch.get_rng_state()  # as the worker process's after its start
        self.tokenizer = self.learner.tokenizer

    @property
    def learner(self) -> Learner:
        """The first policy's learner (the only one for a single-policy pool)."""
        return next(iter(self.worker.learners.values()))

    def _call_each(self, method: WorkerMethod, args: list[tuple]) -> list[Any]:
        with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):  # the global RNG is left as it was
            torch.set_rng_state(self._rng)
            out = [method(self.worker)(*a) for a in args]
            self._rng = torch.get_rng_state()
        return out

    def rollout_copy(self, adapter: str | None = None) -> RolloutCopy:
        """A copy of policy ``adapter`` that generates while this pool trains (async rollout).
        From then on a batch with samples older than its policy is marked stale, so the PPO
        ratio takes their rollout (behaviour) log-probs as the old ones."""
        name = self._trainable(adapter)
        self.lagging = True
        return RolloutCopy(self, name, self.worker.module_copy(name))

    def shutdown(self) -> None:
        """Stops the worker's rollout engine (vLLM)."""
        self.worker.close()


class RolloutCopy:
    """A policy's weights at one version, generating in a process of its own while its pool
    trains (``train.async_rollout``, :mod:`agentrt.controller.async_rollout`).

    A process, not a thread: generating a small model is mostly Python work between small
    kernels, which holds the GIL, so a rollout thread and the update took turns instead of
    overlapping (docs/async.md). The process reads the copy's weights from shared memory (synced
    in place, no transfer) and samples from its own random stream, seeded per step
    (:meth:`reseed`), so what it samples does not depend on timing. :meth:`start` starts the
    process (seconds: a forkserver imports torch once per run), so a caller may run it aside.
    """

    def __init__(self, pool: LocalPool, name: str, module: ModuleCopy) -> None:
        self.pool, self.name, self.module = pool, name, module
        self.version = -1  # no weights yet: sync() first
        ctx = torch.multiprocessing.get_context("forkserver")  # forks of a clean server
        ctx.set_forkserver_preload(["agentrt.runtime.pool"])
        self._conn, self._child = ctx.Pipe()
        threads = max(1, torch.get_num_threads() // 2)  # the update's thread keeps the rest
        self._proc = ctx.Process(target=_serve_copy, daemon=True, name=f"agentrt-rollout-{name}",
                                 args=(module.module, module.tokenizer, module.batch_size,
                                       module.autocast_dtype, module.decode, threads,
                                       self._child))
        self._seed: int | None = None

    def start(self) -> None:
        self._proc.start()
        self._child.close()

    def sync(self) -> None:
        """Takes the policy's current weights and version (between steps, not during one)."""
        with self.pool._lock:
            self.module.sync()
            self.version = self.pool.version_of(self.name)

    def reseed(self, seed: int) -> None:
        """Starts the copy's random stream at ``seed`` (a function of the run seed and step)
        with its next call."""
        self._seed = seed

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[Completion]:
        seed, self._seed = self._seed, None
        return self._call(prompts, sampling, seed)

    def _call(self, *request: Any) -> Any:
        if self._proc.pid is None:
            raise RuntimeError("RolloutCopy.start() first")
        try:
            self._conn.send(request)
            ok, out = self._conn.recv()
        except (EOFError, OSError):
            raise RuntimeError(f"the rollout process of {self.name!r} died (exit code "
                               f"{self._proc.exitcode})") from None
        if not ok:
            raise RuntimeError(f"the rollout process of {self.name!r} failed: {out}")
        return out

    def close(self, timeout: float = 10.0) -> None:
        """Asks the process to end; one that has not within ``timeout`` seconds (hung) is
        terminated, so no process outlives the copy."""
        if self._proc.pid is not None and self._proc.is_alive():
            with contextlib.suppress(OSError):  # it died meanwhile: nothing reads the pipe
                self._conn.send(None)
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.kill()  # SIGKILL: a stopped process does not act on SIGTERM
                self._proc.join()
        self._conn.close()


def _serve_copy(module: Any, tokenizer: Any, batch_size: int, autocast: Any, decode: str,
                threads: int, conn: Any) -> None:
    """The rollout process: answers ``(prompts, sampling, seed)`` requests (a seed starts its
    random stream first) until ``None`` or until its parent is gone."""
    from agentrt.runtime.rollout.hf import HFRollout
    from agentrt.config.rollout import SamplingConfig

    torch.set_num_threads(threads)
    hf = HFRollout(module, tokenizer, SamplingConfig(), batch_size, autocast, decode)
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        prompts, sampling, seed = request
        try:
            if seed is not None:
                torch.manual_seed(seed)
            conn.send((True, hf.generate(prompts, sampling)))
        except Exception as exc:  # noqa: BLE001 - sent to the caller, raised there
            conn.send((False, f"{type(exc).__name__}: {exc}"))
