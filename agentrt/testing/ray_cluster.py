"""A multi-node Ray cluster on one machine: a head and worker nodes, each its own raylet started
with ``ray start ... --block`` in its own process group, for tests and benchmarks.

Each node is what a machine of a real cluster runs (GCS on the head; a raylet, object store and
workers on every node), so a run on it crosses node boundaries exactly as on a cluster: actors on
different nodes talk over gRPC and their object stores, placement groups spread or pack bundles
over nodes, and :meth:`LocalRayCluster.kill_node` is a node loss (its raylet and every worker on it
gone at once, SIGKILL), not a worker crash. Every worker node carries the custom resource
``node_<i>`` plus the ones it is given, so a pool can be pinned to a node (``resources.custom``).

The cluster uses token authentication with a fresh token (the default of ``ray start`` since
Ray 2.5x). A driver joins it with :attr:`LocalRayCluster.env` in its environment and
``runtime.address`` set to :attr:`LocalRayCluster.address`. Linux kills the nodes if the process
that started them dies.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentrt.core.errors import AgentrtError
from agentrt.testing.redis_server import _die_with_parent, free_port


def distinct_free_ports(n: int) -> list[int]:
    """``n`` different free ports (two free_port() calls may give the same one, and Ray refuses
    a node whose components share a port)."""
    found: list[int] = []
    while len(found) < n:
        port = free_port()
        if port not in found:
            found.append(port)
    return found


# The GCS declares a node dead after this many missed health checks (Ray's defaults: every 3 s,
# 5 misses, so about 15 s); a test sees a node loss in about 5 s.
HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}


class LocalRayCluster:
    """Starts, kills and stops a Ray head and ``len(workers)`` worker nodes on this machine.

    Args:
        workers: Custom resources of each worker node (``[{"gpu_box": 1}, {}]``); node ``i``
            also gets ``{"node_<i>": 1}``.
        cpus_per_node: CPUs each worker node offers (the head offers none: only the driver and
            Ray's own services run there, as on a head of a real cluster).
        object_store_mb: Object store of each node.
        dashboard: Start the head's dashboard (its job server: ``ray job submit`` to
            :attr:`dashboard_url`) on 127.0.0.1.
    """

    def __init__(self, workers: list[dict[str, float]], cpus_per_node: int = 1,
                 object_store_mb: int = 100, dashboard: bool = False) -> None:
        self.workers = [{f"node_{i}": 1.0, **res} for i, res in enumerate(workers)]
        self.cpus = cpus_per_node
        self.store_bytes = object_store_mb * 1024 * 1024
        self.tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: socket paths are limited
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard_port = free_port() if dashboard else None
        self.dashboard_url = f"http://127.0.0.1:{self.dashboard_port}" if dashboard else None
        # What every node and every driver needs: the same token, and Ray's multi-node switch.
        self.env = {"RAY_TMPDIR": self.tmp, "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN": secrets.token_hex(32),
                    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_USAGE_STATS_ENABLED": "0"}
        self.procs: list[subprocess.Popen] = []  # [head, worker 0, worker 1, ...]
        self.killed: set[int] = set()  # indexes in procs

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout_s: float = 120.0) -> LocalRayCluster:
        """Starts the head, then the worker nodes; returns when all of them are alive."""
        try:
            board = (["--include-dashboard=false"] if self.dashboard_port is None else
                     ["--include-dashboard=true", "--dashboard-host=127.0.0.1",
                      f"--dashboard-port={self.dashboard_port}"])
            self.procs.append(self._ray_start(
                ["--head", f"--port={self.port}", "--num-cpus=0", *board,
                 "--resources", json.dumps({"head": 1.0}),
                 "--system-config", json.dumps(HEALTH_CHECKS)], "head"))
            self._wait(lambda: self._port_open(self.port), timeout_s, "the head's GCS to listen")
            if self.dashboard_port is not None:
                self._wait(lambda: self._port_open(self.dashboard_port), timeout_s,
                           "the dashboard (job server) to listen")
            for i in range(len(self.workers)):  # one at a time: each raylet's start-up is
                self.procs.append(self._start_worker(i))  # a few CPU-seconds
                self._wait(lambda: self.alive_nodes() == i + 2, timeout_s, f"node_{i} to join")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kills every node (SIGKILL to each process group) and removes the temp folder."""
        for proc in self.procs:
            self._killpg(proc)
        self.procs, self.killed = [], set()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def kill_node(self, index: int) -> None:
        """A node loss: SIGKILL to worker node ``index``'s raylet and everything it started."""
        self._killpg(self.procs[index + 1])
        self.killed.add(index + 1)

    def restart_node(self, index: int, timeout_s: float = 120.0) -> None:
        """Starts worker node ``index`` again (a new raylet with its resources) after a
        :meth:`kill_node`; returns when the cluster counts it alive."""
        self.procs[index + 1] = self._start_worker(index)
        self.killed.discard(index + 1)
        self._wait(lambda: self.alive_nodes() == len(self.workers) + 1, timeout_s,
                   f"node_{index} to join again")

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ state
    def alive_nodes(self) -> int:
        """Nodes the GCS counts alive (asked in a child process: this one may be another
        cluster's driver)."""
        code = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False, "
                "logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))")
        out = subprocess.run([sys.executable, "-c", code, self.address], capture_output=True,
                             text=True, env=self.environ(), timeout=60)
        first = out.stdout.split("\n", 1)[0].strip()  # Ray may print its logs after it
        return int(first) if out.returncode == 0 and first.isdigit() else 0

    def node_of(self, pid: int) -> int | None:
        """The worker node (index) whose raylet started process ``pid``; None: the head's, or
        no node's."""
        parents = _parents()
        starters = {p.pid: i - 1 for i, p in enumerate(self.procs)}
        while pid in parents and pid not in starters:
            pid = parents[pid]
        index = starters.get(pid)
        return None if index is None or index < 0 else index

    def environ(self) -> dict[str, str]:
        """This process's environment plus :attr:`env`: for a driver's ``subprocess``."""
        return {**os.environ, **self.env}

    def log(self, name: str) -> str:
        """What ``ray start`` printed for ``head`` or ``node_<i>``."""
        path = Path(self.tmp) / f"{name}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    # ------------------------------------------------------------------ helpers
    def _start_worker(self, index: int) -> subprocess.Popen:
        return self._ray_start([f"--address={self.address}", f"--num-cpus={self.cpus}",
                                "--resources", json.dumps(self.workers[index])], f"node_{index}")

    def _ray_start(self, args: list[str], name: str) -> subprocess.Popen:
        ray = Path(sys.executable).with_name("ray")
        log = open(Path(self.tmp) / f"{name}.log", "ab")  # noqa: SIM115 (the node owns it)
        # Every port a node listens on is its own: Ray's fixed defaults (the dashboard agent's
        # 52365, the client server's 10001) would collide between nodes of one machine.
        flags = ["node-manager-port", "object-manager-port", "metrics-export-port",
                 "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                 "runtime-env-agent-port"] + ["ray-client-server-port"] * ("--head" in args)
        ports = dict(zip(flags, distinct_free_ports(len(flags))))
        cmd = [str(ray), "start", "--block", "--node-ip-address=127.0.0.1",
               "--disable-usage-stats", f"--object-store-memory={self.store_bytes}",
               *(f"--{flag}={port}" for flag, port in ports.items()), *args]

        def child() -> None:
            os.setsid()  # its own process group: kill_node takes the raylet and its workers
            _die_with_parent()

        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=self.environ(), preexec_fn=child)

    @staticmethod
    def _port_open(port: int) -> bool:
        import socket

        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", port)) == 0

    def _wait(self, cond, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            dead = [p for i, p in enumerate(self.procs)
                    if i not in self.killed and p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(self.log(n)[-600:] for n in
                                 ["head", *(f"node_{i}" for i in range(len(self.workers)))])
                raise AgentrtError(f"local Ray cluster: waited {timeout_s:.0f} s for {what}; "
                                   f"ray start said:\n{logs}")
            time.sleep(0.5)

    @staticmethod
    def _killpg(proc: subprocess.Popen) -> None:
        """SIGKILL to the node's process group and to every process under it (Ray starts its
        workers in process groups of their own)."""
        family = _descendants(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
                stat = (entry / "stat").read_text()
                out[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return out


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
