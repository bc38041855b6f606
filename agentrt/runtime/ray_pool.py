"""Policy pools on Ray: a :class:`PolicyPool` runs one :class:`~agentrt.runtime.worker.PolicyWorker` per
data-parallel worker as a Ray actor in a placement group, with recovery from dead workers.

The driver-side logic (the pool API, collation, advantages once per batch) is
:class:`agentrt.runtime.pool.BasePool`'s; this module adds the transport and fault tolerance.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrt.algos.rae import RAEState
from agentrt.config.sections import PolicyConfig, ResourcesConfig, RuntimeConfig
from agentrt.core.errors import AgentrtError
from agentrt.core.types import Trajectory
from agentrt.runtime.pool import BasePool, WorkerMethod, resolve_model
from agentrt.runtime.worker import PolicyWorker

log = logging.getLogger(__name__)


class WorkerLost(AgentrtError):
    """A worker process died during a call (killed, OOM, node lost)."""


# Ray's own switch for a one-machine Ray (its default on macOS and Windows): the node address is
# 127.0.0.1, so the GCS, raylet, workers and agents listen on loopback only. Read when Ray is
# imported and inherited by the processes it starts.
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def ensure_ray(runtime: RuntimeConfig | None = None) -> bool:
    """Starts Ray here (or joins ``runtime.address``) unless it runs; True when this call did.

    A Ray started here listens on 127.0.0.1 only (no dashboard); reach it from other machines by
    starting a cluster yourself (``ray start --head``) and giving ``runtime.address``."""
    runtime = runtime or RuntimeConfig()
    if runtime.address is None and "ray" not in sys.modules:  # else: too late, and its children
        os.environ.setdefault(LOOPBACK_ENV, "0")  # would disagree with it about the address
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if runtime.address is None:
        kwargs["num_cpus"] = runtime.num_cpus
    ray.init(address=runtime.address, **kwargs)
    if runtime.address is None and not is_loopback(ray.util.get_node_ip_address()):
        log.warning("Ray started on %s, not 127.0.0.1, so it listens on every interface: ray "
                    "was imported before agentrt started it; export %s=0 to keep it local",
                    ray.util.get_node_ip_address(), LOOPBACK_ENV)
    return True


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (``::ffff:127.0.0.1``)."""
    import ipaddress

    ip = ipaddress.ip_address(host)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def gather(refs: list[Any], timeout_s: float) -> list[Any]:
    """The results of one call on every worker, or :class:`WorkerLost` as soon as one died.

    Waits one result at a time so that a dead worker is seen at once, not after its peers time
    out in a collective (``timeout_s``). A result is fetched as soon as its call is done: a large
    one lives on its worker's node until then, and a node lost in between takes it along
    (``ObjectLostError``: the worker that made it is gone, so it is a lost worker too). A fetch
    that does not end within ``timeout_s`` is a lost worker too: after a node loss Ray's pull of
    a result from a surviving node was seen to wait forever (tests/test_multinode.py), and a
    recovery makes the result again.
    """
    import ray
    from ray.exceptions import (GetTimeoutError, ObjectLostError, OutOfMemoryError,
                                RayActorError, RayTaskError)

    results: dict[int, Any] = {}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1, fetch_local=False)
        i = refs.index(done[0])
        try:
            results[i] = ray.get(done[0], timeout=timeout_s)
        except (RayActorError, OutOfMemoryError, ObjectLostError) as exc:
            raise WorkerLost(f"worker {i} died: {exc}") from exc
        except GetTimeoutError as exc:
            raise WorkerLost(f"worker {i}'s result was not fetched in {timeout_s:.0f} s "
                             f"(runtime.collective_timeout_s): {exc}") from exc
        except RayTaskError as exc:  # a peer died inside a collective, or a real bug
            if _peer_died(pending, timeout_s):
                raise WorkerLost(f"worker {i} lost a peer: {exc}") from exc
            raise
    return [results[i] for i in range(len(refs))]


def _peer_died(pending: list[Any], timeout_s: float) -> bool:
    import ray
    from ray.exceptions import RayActorError, RayError

    done, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout_s)
    for ref in done:
        try:
            ray.get(ref)
        except RayActorError:
            return True
        except RayError:
            continue
    return len(done) < len(pending)


class PolicyPool(BasePool):
    """A pool of Ray actors, one :class:`~agentrt.runtime.worker.PolicyWorker` per data-parallel worker.

    Fault tolerance: the pool keeps its last checkpoint (the state its ``state_dict`` returned or
    ``load_state_dict`` received; the initial state before that) and a journal of every
    state-changing call since (``train``/``sft_step``/``snapshot``, with their trajectories,
    which live on the driver). When a worker dies, the pool replaces every worker by a fresh
    actor (their process group lost a peer), restores the checkpoint, replays the journal and
    retries the failed call: no trajectory is lost or trained twice. A worker lost during a
    recovery starts it again, up to ``max_recoveries`` per call. Each recovery is logged and
    counted in ``runtime/worker_restarts``, and the wall time it cost (the failed call's and the
    recovery's) in ``runtime/recovery_s``. A lost node is the same: Ray moves the placement
    group's bundles that were on it to nodes with room (or waits for one) and the fresh actors
    start there.

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
        runtime = runtime or RuntimeConfig()
        self.timeout_s = runtime.collective_timeout_s
        self.keep_memory = runtime.keep_freed_memory
        self.max_recoveries = max_recoveries
        self.owns_ray = ensure_ray(runtime)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(policies[0].model.path)
        self.worker_restarts = 0
        self.replayed_calls = 0
        self.recovery_s = 0.0  # wall time lost to failed calls and recoveries
        self._checkpoint: Any = None  # ObjectRef of the recovery point; None: initial state
        self._initial = {"rae": dict(self.rae), "versions": dict(self.versions)}
        self._journal: list[tuple[Callable[..., Any], tuple]] = []  # (impl, args) replayed
        self._policies_at_checkpoint = dict(self.policies)  # live changes (agentrt.controller.control)
        try:
            self._start_workers(policies, seed, total_steps)
        except BaseException:
            self.shutdown()  # no half-started pool keeps its placement group (or Ray) alive
            raise

    def _start_workers(self, policies: list[PolicyConfig], seed: int, total_steps: int) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {"CPU": self.res.cpus_per_worker, **self.res.custom}
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

        def spawn(i: int) -> Any:  # worker i, in its bundle of the placement group
            return remote.options(
                num_cpus=self.res.cpus_per_worker, num_gpus=self.res.gpus_per_worker,
                max_restarts=self.res.max_restarts, max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.pg, placement_group_bundle_index=i),
            ).remote(policies, seed, total_steps, threads, keep_memory=self.keep_memory)

        self._spawn = spawn
        self.workers = [spawn(i) for i in range(self.num_workers)]
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

    def _call_each(self, method: WorkerMethod, args: list[tuple]) -> list[Any]:
        refs = [method(w).remote(*a) for w, a in zip(self.workers, args)]
        return gather(refs, self.timeout_s)

    # ------------------------------------------------------------------ recovery
    def _guarded(self, impl: Callable[..., Any], *args: Any, journal: bool = True) -> Any:
        """``impl(*args)``, retried after a recovery when a worker died; with ``journal``,
        kept in the journal (replayed after a later recovery)."""
        with self._lock:
            recoveries = 0
            while True:
                start = time.monotonic()
                try:
                    out = impl(*args)
                    break
                except WorkerLost as exc:
                    lost: WorkerLost | None = exc
                # A recovery can lose a worker too (e.g. Ray restarts an actor of a dead node a
                # second time while the journal is replayed): each recovery starts from the
                # checkpoint again, so it is simply tried again, within the same budget.
                while lost is not None:
                    if recoveries == self.max_recoveries:
                        raise lost
                    recoveries += 1
                    try:
                        self._recover(lost)
                        lost = None
                    except WorkerLost as exc:
                        lost = exc
                self.recovery_s += time.monotonic() - start  # the failed tries + recoveries
            if journal:
                self._journal.append((impl, args))
            return out

    def train(self, trajectories: list[Trajectory], adapter: str | None = None
              ) -> dict[str, float]:
        """As :meth:`BasePool.train`, with the worker restarts so far in the metrics."""
        with self._lock:
            metrics = super().train(trajectories, adapter)
            metrics["runtime/worker_restarts"] = float(self.worker_restarts)
            metrics["runtime/recovery_s"] = self.recovery_s
            return metrics

    def _recover(self, exc: WorkerLost) -> None:
        import ray

        self.worker_restarts += 1
        trajs = sum(len(args[0]) for impl, args in self._journal
                    if impl in (self._train, self._sft_step))
        log.warning("pool %r: %s. Restarting its workers, restoring its last checkpoint and "
                    "replaying %d calls (%d trajectories kept on the driver)", self.cfg.id, exc,
                    len(self._journal), trajs)
        old = list(self.pids)
        # Every worker is replaced (peers of a dead worker hold a broken process group) by a
        # fresh actor in its bundle: a Ray restart would use up the actor's max_restarts, two
        # or three recoveries in a long run, and the next loss would end it.
        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers = [self._spawn(i) for i in range(self.num_workers)]
        self._connect(old_pids=old)
        if self._checkpoint is not None:
            self._load(ray.get(self._checkpoint))
        else:
            self.rae = {k: RAEState(alpha=v.alpha, init=v.init)
                        for k, v in self._initial["rae"].items()}
            self.versions = dict(self._initial["versions"])
        # A restarted actor has its config from the start; a live change (reconfigure) made
        # before the recovery point is not in the journal, so it is applied again first.
        for cfg in self._policies_at_checkpoint.values():
            self._reconfigure(cfg, cfg.id)
        for impl, args in self._journal:
            impl(*args)
        self.replayed_calls += len(self._journal)

    def _checkpointed(self, state: dict[str, Any]) -> None:
        import ray

        self._checkpoint = ray.put(state)
        self._journal = []
        self._policies_at_checkpoint = dict(self.policies)

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
