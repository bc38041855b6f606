"""Policy pools: the API a controller drives one policy (or several LoRA policies) through.

A pool hosts one full-weight policy, or several LoRA policies over one shared base model, on N
data-parallel workers (:class:`~agentrt.worker.PolicyWorker`). :class:`PolicyPool` runs them as
Ray actors in a placement group (gradients all-reduced over gloo); :class:`LocalPool` runs one in
this process, no Ray (tests, bench baseline, ``runtime.backend: local``). Same API (stable; the
tournament controller calls exactly this; docs/runtime.md)::

    pool.generate(prompts, sampling=None, adapter=None) -> list[Completion]   # order preserved
    pool.train(trajectories, adapter=None) -> dict[str, float]                # one RL step
    pool.version / pool.version_of(adapter) ; pool.snapshot(adapter, tag) -> "adapter@tag"
    pool.state_dict() / pool.load_state_dict(state) ; pool.shutdown()

``train`` collates here, has every worker ``prepare`` its rows, computes advantages *once* on the
whole batch here (group baselines need the whole batch; "rae" must see each batch once), then
every worker updates on its share of each mini-batch with gradients summed over workers.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import torch

from agentrt.algos import RAEState
from agentrt.config import PolicyConfig, ResourcesConfig, RuntimeConfig, SamplingConfig, SFTConfig
from agentrt.engine import Completion, HybridEngine, advantages_from
from agentrt.errors import AgentrtError
from agentrt.types import Trajectory, collate
from agentrt.weights import model_folder
from agentrt.worker import PolicyWorker, gather_prepared, split_rows

log = logging.getLogger(__name__)


READ_ONLY = ("generate", "fill_reference", "preference_eval")
_GLOBAL_RNG = threading.Lock()  # local pools take turns with torch's global generator


class WorkerLost(AgentrtError):
    """A worker process died during a call (killed, OOM, node lost)."""


def resolve_model(cfg: PolicyConfig, workdir: str | Path | None, seed: int) -> PolicyConfig:
    """``cfg`` with ``model.path`` set: a preset is built once here (as the engine would), so
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
        self.tokenizer: Any = None
        self._lock = threading.RLock()  # one call at a time per pool (controller threads)

    # ------------------------------------------------------------------ transport (subclasses)
    def _call_each(self, method: str, args: list[tuple]) -> list[Any]:
        """Calls ``method(*args[i])`` on worker ``i`` for every worker; results in order."""
        raise NotImplementedError

    def _put(self, obj: Any) -> Any:
        """Ships a large argument once for all workers (``ray.put`` for Ray)."""
        return obj

    def _call(self, method: str, *args: Any) -> list[Any]:
        return self._call_each(method, [args] * self.num_workers)

    def _run(self, op: str, *args: Any) -> Any:
        """Runs ``self._<op>(*args)``; the Ray pool adds recovery and journaling."""
        with self._lock:
            return getattr(self, f"_{op}")(*args)

    # ------------------------------------------------------------------ engine-like facade
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
        return self._run("generate", prompts, sampling, self._name(adapter))

    def train(self, trajectories: list[Trajectory], adapter: str | None = None
              ) -> dict[str, float]:
        """One RL step of ``adapter`` (the only policy when None) on ``trajectories``."""
        return self._run("train", trajectories, self._trainable(adapter))

    def sft_step(self, trajectories: list[Trajectory], sft: SFTConfig,
                 adapter: str | None = None) -> dict[str, float]:
        """One supervised step on demonstrations (loss on the response tokens)."""
        return self._run("sft_step", trajectories, sft, self._trainable(adapter))

    def end_sft(self, adapter: str | None = None) -> None:
        """Ends the warm start: drops the SFT optimizer; the policy's version restarts at 0."""
        self._run("end_sft", self._trainable(adapter))

    def preference_step(self, examples: list[Any], pairs: str = "all",
                        adapter: str | None = None) -> dict[str, float]:
        """One preference-loss step (dpo, ipo, kto, listwise) on ``examples``; those without
        reference log-probs get them from the policy's reference first."""
        return self._run("preference_step", examples, pairs, self._trainable(adapter))

    def fill_reference(self, examples: list[Any], adapter: str | None = None) -> list[Any]:
        """``examples`` with reference log-probs of the policy as it stands now (offline data)."""
        return self._run("fill_reference", examples, self._trainable(adapter))

    def preference_eval(self, examples: list[Any], adapter: str | None = None
                        ) -> dict[str, float]:
        """Held-out preference accuracy and margin (from worker 0)."""
        return self._run("preference_eval", examples, self._trainable(adapter))

    def snapshot(self, adapter: str, tag: str) -> str:
        """Freezes policy ``adapter`` as ``"<adapter>@<tag>"`` (returned), which keeps its
        weights and version while the source trains on: one more adapter for LoRA policies,
        a CPU copy of the weights for full-weight ones."""
        return self._run("snapshot", self._trainable(adapter), str(tag))

    def drop_snapshot(self, name: str) -> None:
        """Frees a snapshot (it left the league)."""
        if name in self.policies:
            raise ValueError(f"{name!r} is a policy, not a snapshot")
        self._run("drop_snapshot", self._name(name))

    def reset_to(self, adapter: str, snapshot: str) -> None:
        """Loads ``snapshot``'s weights into policy ``adapter`` (a league exploiter's reset)."""
        self._run("reset_to", self._trainable(adapter), self._name(snapshot))

    def weights(self, adapter: str | None = None) -> dict[str, torch.Tensor]:
        """Trainable weights of a policy or snapshot, from worker 0 (adapter only for LoRA)."""
        return self._call_each("trainable_state", [(self._name(adapter),)])[0]

    def save_pretrained(self, folder: str | Path, adapter: str | None = None) -> Path:
        """Writes the policy in Hugging Face format (from worker 0; ``folder`` must be visible
        to it, e.g. shared storage on a cluster)."""
        return Path(self._call_each("save_pretrained", [(str(folder), self._name(adapter))])[0])

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint: every policy's engine state (with this driver's RAE baselines), snapshot
        weights, and each worker's torch RNG (``rng``, one per worker)."""
        with self._lock:
            parts = self._call_each("state_dict", [(i == 0,) for i in range(self.num_workers)])
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
        outs = self._call_each("generate", [(prompts[r], sampling, name) for r in parts])
        return [c for out in outs for c in out]

    def _train(self, trajectories: list[Trajectory], name: str) -> dict[str, float]:
        algo = self.policies[name].algorithm
        start = time.perf_counter()
        batch = collate(trajectories, self.pad_id)
        self._check_split(batch.size, algo.mini_batches, name)
        ref = self._put(batch)
        prepared = self._call_each("prepare", [(ref, rows, name) for rows in
                                               split_rows(batch.size, self.num_workers)])
        metrics = gather_prepared(batch, prepared)
        metrics["timing_s/prepare"] = time.perf_counter() - start
        metrics |= advantages_from(batch, algo, prepared[0].kl_coef, self.rae[name])
        start = time.perf_counter()
        metrics |= self._call("update", self._put(batch), name)[0]  # identical on all workers
        metrics["timing_s/update"] = time.perf_counter() - start
        metrics["perf/train_tokens"] = float(batch.num_tokens)
        self.versions[name] += 1
        return metrics

    def _sft_step(self, trajectories: list[Trajectory], sft: SFTConfig, name: str
                  ) -> dict[str, float]:
        batch = collate(trajectories, self.pad_id)
        self._check_split(batch.size, 1, name)
        metrics = self._call("sft_step", self._put(batch), sft, name)[0]
        self.versions[name] += 1
        return metrics

    def _end_sft(self, name: str) -> None:
        self._call("end_sft", name)
        self.versions[name] = 0

    def _snapshot(self, name: str, tag: str) -> str:
        snap = self._call("snapshot", name, tag)[0]
        self.versions[snap] = self.versions[name]
        return snap

    def _drop_snapshot(self, name: str) -> None:
        self._call("drop_snapshot", name)
        del self.versions[name]

    def _reset_to(self, name: str, snapshot: str) -> None:
        self._call("reset_to", name, snapshot)

    def _preference_step(self, examples: list[Any], pairs: str, name: str) -> dict[str, float]:
        start = time.perf_counter()
        if self.num_workers > 1 and len(examples) < self.num_workers:
            raise ValueError(f"policy {name!r}: {len(examples)} preference examples for "
                             f"{self.num_workers} workers; train on more examples")
        metrics = self._call("preference_step", self._put(examples), pairs, name)[0]
        metrics["timing_s/update"] = time.perf_counter() - start
        self.versions[name] += 1
        return metrics

    def _fill_reference(self, examples: list[Any], name: str) -> list[Any]:
        return self._call_each("fill_reference", [(examples, name)])[0]

    def _preference_eval(self, examples: list[Any], name: str) -> dict[str, float]:
        return self._call_each("preference_eval", [(examples, name)])[0]

    def _check_split(self, size: int, mini_batches: int, name: str) -> None:
        """Every worker needs >= 1 row of every mini-batch (same shapes in every collective)."""
        width = -(-size // mini_batches)  # the engine's mini-batch size, ceil(size / mini_batches)
        smallest = min(min(width, size - start) for start in range(0, size, width))
        if self.num_workers > 1 and smallest < self.num_workers:
            raise ValueError(
                f"policy {name!r}: {size} trajectories in {mini_batches} mini-batches leave a "
                f"mini-batch of {smallest} rows for {self.num_workers} workers; train on more "
                "trajectories or lower algorithm.mini_batches")

    def _load(self, state: dict[str, Any]) -> None:
        ref = self._put(state)
        self._call_each("load_state_dict", [(ref, i) for i in range(self.num_workers)])
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
        seed: Initialisation seed (as ``HybridEngine``).
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
        self.tokenizer = self.engine.tokenizer

    @property
    def engine(self) -> HybridEngine:
        """The first policy's engine (the only one for a single-policy pool)."""
        return next(iter(self.worker.engines.values()))

    def _call_each(self, method: str, args: list[tuple]) -> list[Any]:
        with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):  # the global RNG is left as it was
            torch.set_rng_state(self._rng)
            out = [getattr(self.worker, method)(*a) for a in args]
            self._rng = torch.get_rng_state()
        return out

    def shutdown(self) -> None:
        """Stops the worker's rollout engine (vLLM)."""
        self.worker.close()


def ensure_ray(runtime: RuntimeConfig | None = None) -> bool:
    """Starts Ray here (or joins ``runtime.address``) unless it runs; True when this call did."""
    import ray

    if ray.is_initialized():
        return False
    runtime = runtime or RuntimeConfig()
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if runtime.address is None:
        kwargs["num_cpus"] = runtime.num_cpus
    ray.init(address=runtime.address, **kwargs)
    return True


class PolicyPool(BasePool):
    """A pool of Ray actors, one :class:`~agentrt.worker.PolicyWorker` per data-parallel worker.

    Fault tolerance: the pool keeps its last checkpoint (the state its ``state_dict`` returned or
    ``load_state_dict`` received; the initial state before that) and a journal of every
    state-changing call since (``train``/``sft_step``/``snapshot``, with their trajectories,
    which live on the driver). When a worker dies, Ray restarts it (``max_restarts``), the pool
    restarts the others too (their process group lost a peer), restores the checkpoint, replays
    the journal and retries the failed call: no trajectory is lost or trained twice. Each such
    recovery is logged and counted in ``runtime/worker_restarts``.

    Args:
        policies: One policy, or several LoRA policies sharing a base model.
        resources: Workers and their resources (default: the first policy's ``resources``).
        seed: Initialisation seed (every worker uses it: replicas start identical).
        total_steps: Steps the LR schedules span.
        workdir: Where a preset model is built (visible to the workers).
        runtime: How to reach Ray when it is not running yet.
        max_recoveries: Recoveries tried for one call before giving up.
    """

    def __init__(self, policies: PolicyConfig | list[PolicyConfig],
                 resources: ResourcesConfig | None = None, seed: int = 0,
                 total_steps: int = 1000, workdir: str | Path | None = None,
                 runtime: RuntimeConfig | None = None, max_recoveries: int = 2) -> None:
        policies = [policies] if isinstance(policies, PolicyConfig) else list(policies)
        policies = [resolve_model(p, workdir, seed) for p in policies]
        super().__init__(policies)
        self.res = resources or policies[0].resources
        self.num_workers = self.res.num_workers
        self.timeout_s = (runtime or RuntimeConfig()).collective_timeout_s
        self.max_recoveries = max_recoveries
        self.owns_ray = ensure_ray(runtime)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(policies[0].model.path)
        self.worker_restarts = 0
        self.replayed_calls = 0
        self._checkpoint: Any = None  # ObjectRef of the recovery point; None: initial state
        self._initial = {"rae": dict(self.rae), "versions": dict(self.versions)}
        self._journal: list[tuple[str, tuple]] = []
        try:
            self._start_workers(policies, seed, total_steps)
        except BaseException:
            self.shutdown()  # no half-started pool keeps its placement group (or Ray) alive
            raise

    def _start_workers(self, policies: list[PolicyConfig], seed: int, total_steps: int) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {"CPU": self.res.cpus_per_worker}
        if self.res.gpus_per_worker:
            bundle["GPU"] = self.res.gpus_per_worker
        self.pg = placement_group([bundle] * self.num_workers, strategy=self.res.placement)
        ready, _ = ray.wait([self.pg.ready()], timeout=120)
        if not ready:
            ray.util.remove_placement_group(self.pg)
            raise AgentrtError(
                f"pool {self.cfg.id!r}: Ray cannot place {self.num_workers} workers of {bundle} "
                f"({self.res.placement}) on {ray.cluster_resources()}; lower "
                "resources.num_workers / cpus_per_worker or add nodes")
        threads = max(1, int(self.res.cpus_per_worker))
        remote = ray.remote(PolicyWorker)
        self.workers = [
            remote.options(
                num_cpus=self.res.cpus_per_worker, num_gpus=self.res.gpus_per_worker,
                max_restarts=self.res.max_restarts, max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.pg, placement_group_bundle_index=i),
            ).remote(policies, seed, total_steps, threads)
            for i in range(self.num_workers)
        ]
        self.pids: list[int] = []
        self._connect()

    def _connect(self, old_pids: list[int] | None = None) -> None:
        """Waits for every worker (restarted ones: a new pid), then forms the gloo group."""
        import ray
        from ray.exceptions import RayActorError

        deadline = time.monotonic() + 300
        while True:  # a killed actor may answer once more before it dies, or not yet be back
            try:
                infos = ray.get([w.info.remote() for w in self.workers])
                if old_pids is None or not set(i["pid"] for i in infos) & set(old_pids):
                    break
            except RayActorError as exc:
                if old_pids is None:  # first start: the worker's constructor failed
                    raise AgentrtError(f"pool {self.cfg.id!r}: a worker failed to start: "
                                       f"{str(exc).splitlines()[-1]}") from exc
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.5)
        self.pids = [i["pid"] for i in infos]
        log.info("pool %r: %d workers up (pids %s)", self.cfg.id, self.num_workers, self.pids)
        if self.num_workers > 1:
            addr, port = ray.get(self.workers[0].rendezvous_address.remote())
            ray.get([w.init_data_parallel.remote(addr, port, rank, self.num_workers,
                                                 self.timeout_s)
                     for rank, w in enumerate(self.workers)])

    # ------------------------------------------------------------------ transport
    def _put(self, obj: Any) -> Any:
        import ray

        return ray.put(obj)

    def _call_each(self, method: str, args: list[tuple]) -> list[Any]:
        refs = [getattr(w, method).remote(*a) for w, a in zip(self.workers, args)]
        return self._gather(refs)

    def _gather(self, refs: list[Any]) -> list[Any]:
        """All results, or :class:`WorkerLost` as soon as a worker died.

        Waits one result at a time so that a dead worker is seen at once, not after its peers
        time out in a collective; ``ray.get`` of a finished object does not block.
        """
        import ray
        from ray.exceptions import OutOfMemoryError, RayActorError, RayTaskError

        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except (RayActorError, OutOfMemoryError) as exc:
                raise WorkerLost(f"worker {refs.index(done[0])} died: {exc}") from exc
            except RayTaskError as exc:  # a peer died inside a collective, or a real bug
                if self._peer_died(pending):
                    raise WorkerLost(f"worker {refs.index(done[0])} lost a peer: {exc}") from exc
                raise
        return ray.get(refs)

    def _peer_died(self, pending: list[Any]) -> bool:
        import ray
        from ray.exceptions import RayActorError, RayError

        done, _ = ray.wait(pending, num_returns=len(pending), timeout=self.timeout_s)
        for ref in done:
            try:
                ray.get(ref)
            except RayActorError:
                return True
            except RayError:
                continue
        return len(done) < len(pending)

    # ------------------------------------------------------------------ recovery
    def _run(self, op: str, *args: Any) -> Any:
        with self._lock:
            for attempt in range(self.max_recoveries + 1):
                try:
                    out = getattr(self, f"_{op}")(*args)
                    break
                except WorkerLost as exc:
                    if attempt == self.max_recoveries:
                        raise
                    self._recover(exc)
            if op not in READ_ONLY:  # everything else changes state: replayed after a failure
                self._journal.append((op, args))
            if op == "train":
                out["runtime/worker_restarts"] = float(self.worker_restarts)
            return out

    def _recover(self, exc: WorkerLost) -> None:
        import ray

        self.worker_restarts += 1
        trajs = sum(len(a[0]) for op, a in self._journal if op in ("train", "sft_step"))
        log.warning("pool %r: %s. Restarting its workers, restoring its last checkpoint and "
                    "replaying %d calls (%d trajectories kept on the driver)", self.cfg.id, exc,
                    len(self._journal), trajs)
        old = list(self.pids)
        for w in self.workers:  # peers of a dead worker hold a broken process group
            ray.kill(w, no_restart=False)
        self._connect(old_pids=old)
        if self._checkpoint is not None:
            self._load(ray.get(self._checkpoint))
        else:
            self.rae = {k: RAEState(alpha=v.alpha, init=v.init)
                        for k, v in self._initial["rae"].items()}
            self.versions = dict(self._initial["versions"])
        for op, args in self._journal:
            getattr(self, f"_{op}")(*args)
        self.replayed_calls += len(self._journal)

    def _checkpointed(self, state: dict[str, Any]) -> None:
        import ray

        self._checkpoint = ray.put(state)
        self._journal = []

    def shutdown(self) -> None:
        """Kills the workers, frees the placement group, and stops Ray if this pool started it."""
        import ray

        if not ray.is_initialized():
            return
        workers = getattr(self, "workers", [])
        if workers:  # ray.kill runs no finalisers: stop vLLM and delete its adapter folders first
            refs = [w.close.remote() for w in workers]
            ray.wait(refs, num_returns=len(refs), timeout=30)  # a dead worker's error is ready
        for w in workers:
            ray.kill(w, no_restart=True)
        self.workers = []
        if getattr(self, "pg", None) is not None:
            ray.util.remove_placement_group(self.pg)
            self.pg = None
        if self.owns_ray:
            ray.shutdown()
