"""A real redis-server process on a free 127.0.0.1 port, for tests and benchmarks.

It runs with append-only persistence and ``appendfsync always`` in its own folder, so killing it
with SIGKILL loses no acknowledged write, and :meth:`RedisServer.restart` brings back the same
data on the same port. Only loopback is ever bound.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from agentrt.memory.errors import BackendUnavailableError

INSTALL_HINT = ("redis-server was not found on PATH; run `make test` (it installs Debian's "
                "redis-server) or `apt-get install -y redis-server`")


def find_redis_server() -> str:
    """Path of the redis-server binary. Raises BackendUnavailableError with a fix if missing."""
    path = shutil.which("redis-server")
    if path is None:
        raise BackendUnavailableError(INSTALL_HINT)
    return path


def _die_with_parent() -> None:
    """Runs in the child before exec: Linux kills it if the test process dies (no orphans)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """Starts, kills and restarts one redis-server bound to 127.0.0.1.

    Args:
        password: requirepass, when given.
        folder: Data folder (a temporary one by default, removed by :meth:`stop`).
        tls: ``(cert_file, key_file, ca_file)``: serve TLS only (``rediss://``) with this
            certificate; clients are not asked for certificates.
    """

    def __init__(self, password: str | None = None, folder: str | Path | None = None,
                 tls: tuple[str, str, str] | None = None) -> None:
        self.binary = find_redis_server()
        self.password = password
        self.tls = tls
        self._own_folder = folder is None
        self.folder = Path(folder or tempfile.mkdtemp(prefix="agentrt-redis-"))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Starts the server (a new free port the first time, the same port after a kill)."""
        if self.proc is not None and self.proc.poll() is None:
            return self  # already running
        for _ in range(5):  # the free port can be taken between probing and binding: retry
            port = self.port or free_port()
            ports = ["--port", str(port)]
            if self.tls:
                cert, key, ca = self.tls
                ports = ["--port", "0", "--tls-port", str(port), "--tls-cert-file", cert,
                         "--tls-key-file", key, "--tls-ca-cert-file", ca,
                         "--tls-auth-clients", "no"]
            args = [self.binary, "--bind", "127.0.0.1", *ports, "--dir",
                    str(self.folder), "--appendonly", "yes", "--appendfsync", "always",
                    "--save", "", "--protected-mode", "yes", "--daemonize", "no",
                    "--logfile", str(self.folder / "redis.log")]
            if self.password:
                args += ["--requirepass", self.password]
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         preexec_fn=_die_with_parent)
            if self._wait_ready(port, timeout_s):
                self.port = port
                return self
            self.kill()
        raise BackendUnavailableError(f"redis-server did not start; see {self.folder}/redis.log")

    def _wait_ready(self, port: int, timeout_s: float) -> bool:
        tls = dict(ssl=True, ssl_ca_certs=self.tls[2]) if self.tls else {}
        client = redis.Redis(host="127.0.0.1", port=port, password=self.password,
                             socket_connect_timeout=0.2, **tls)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    return False
                try:
                    # Our process must still be alive: a ping could reach someone else's server.
                    if client.ping() and self.proc is not None and self.proc.poll() is None:
                        return True
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    time.sleep(0.02)
            return False
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL, the way a crash stops it: no shutdown save, only what the AOF holds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        """Kills the server and removes its temporary folder."""
        self.kill()
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
