"""The shared backend: records in a Redis server, a local FAISS index per worker following a log.

Keys (``P`` = ``<key_prefix>:<bank>``)::

    P:records   hash   id -> JSON record, a NUL byte, float32 vector bytes
    P:log       stream one entry per change: op=put|del, id=<record id>
    P:meta      hash   dim, embedder (checked when a worker opens the bank)

A write runs one Lua script that sets the record only if its id is new (HSETNX) and appends to
the stream only then. Scripts run atomically, so retrying a write whose reply was lost (Redis
died mid-call) can never store a record twice. Each worker keeps a :class:`VectorStore` and,
before every read, applies the stream entries it has not seen (``XREAD`` from its last id): a write
on one worker is visible to the next query on any other. Log entries older than
``log_retention_s`` are trimmed (``P:trimmed`` holds the cut, in ms); a worker that was idle for
longer than that finds its last id before the cut and reloads the whole bank from the hash.

While Redis is unreachable, writes are applied locally at once and queued in order; a background
thread retries them every ``retry_interval_s`` and empties the queue when Redis is back. Redis must
run with persistence (``appendonly yes``) for acknowledged writes to survive a server crash.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from agentrt.memory.bank import MemoryBank
from agentrt.core.urls import redact
from agentrt.memory.config import BankConfig, RedisConfig
from agentrt.memory.embedders import Embedder
from agentrt.memory.errors import BackendUnavailableError, DimensionError, MemoryBankError
from agentrt.memory.records import Record

log = logging.getLogger(__name__)

# Errors that mean "Redis is not there right now" (as opposed to a bad request).
DOWN_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, OSError)

# One script per journaled write: the hash changes and its log entry are one atomic step, and
# only what really changed is logged. ``{step}`` is the loop's stride over ARGV.
_JOURNALED = """
local n = 0
for i = 1, #ARGV, {step} do
  if redis.call({call}) == 1 then
    redis.call('XADD', KEYS[2], '*', 'op', '{op}', 'id', ARGV[i])
    n = n + 1
  end
end
return n
"""
_PUT = _JOURNALED.format(step=2, call="'HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]", op="put")
_DEL = _JOURNALED.format(step=1, call="'HDEL', KEYS[1], ARGV[i]", op="del")
_TRIM = """
local t = redis.call('TIME')
local cutoff = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV[1])
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cutoff > cur then
  redis.call('XTRIM', KEYS[1], 'MINID', cutoff .. '-0')
  redis.call('SET', KEYS[2], cutoff)
  return cutoff
end
return cur
"""
_CHUNK = 500  # records per script call: bounded so one call never blocks Redis for long
_TRIM_EVERY = 200  # write calls between two log trims
_MAX_SEQ = 2**64 - 1


def _id(text: str) -> tuple[int, int]:
    """A stream id "ms-seq" as a comparable tuple."""
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def connect(cfg: RedisConfig) -> redis.Redis:
    """A client for ``cfg`` that has answered PING.

    Raises:
        BackendUnavailableError: nothing answers at the URL, or it refuses the credentials.
    """
    url = cfg.url
    if cfg.tls and url.startswith("redis://"):
        url = "rediss://" + url[len("redis://"):]
    kwargs: dict = dict(socket_connect_timeout=cfg.connect_timeout_s,
                        socket_timeout=cfg.socket_timeout_s,
                        # No hidden retries: a failed call is buffered and retried by the bank.
                        retry=Retry(NoBackoff(), 0))
    if cfg.username is not None:
        kwargs["username"] = cfg.username
    password = cfg.secret()
    if password is not None:
        kwargs["password"] = password
    if url.startswith("rediss://"):
        kwargs.update(ssl_ca_certs=cfg.tls_ca_certs, ssl_certfile=cfg.tls_certfile,
                      ssl_keyfile=cfg.tls_keyfile,
                      ssl_cert_reqs="required" if cfg.tls_verify else "none")
    shown = redact(url)
    try:
        client = redis.Redis.from_url(url, **kwargs)
        client.ping()
    except redis.AuthenticationError as exc:
        raise BackendUnavailableError(
            f"Redis at {shown} refused the credentials ({exc}); fix memory.redis.password"
        ) from None
    except redis.ResponseError as exc:
        raise BackendUnavailableError(f"Redis at {shown} refused the connection ({exc})") from None
    except (*DOWN_ERRORS, ValueError) as exc:
        if "CERTIFICATE_VERIFY_FAILED" in str(exc):
            raise BackendUnavailableError(
                f"Redis at {shown}: the server's TLS certificate could not be verified ({exc}); "
                "set memory.redis.tls_ca_certs to the CA that signed it"
            ) from None
        raise BackendUnavailableError(
            f"Redis at {shown} did not answer within {cfg.connect_timeout_s:g} s ({exc}); "
            "start redis-server there or fix memory.redis.url"
        ) from None
    return client


def _pack(rec: Record, vec: np.ndarray) -> bytes:
    return json.dumps(rec.to_dict()).encode() + b"\0" + np.asarray(vec, np.float32).tobytes()


def _unpack(data: bytes, dim: int) -> tuple[Record, np.ndarray]:
    head, _, tail = data.partition(b"\0")
    return Record.from_dict(json.loads(head)), np.frombuffer(tail, dtype=np.float32).reshape(dim)


class RedisBank(MemoryBank):
    """A memory bank shared by every worker that opens the same Redis URL and bank name.

    Args:
        cfg: Bank config with ``backend: redis`` and a ``redis`` section.
        embedder: Optional shared embedder.

    Raises:
        BackendUnavailableError: Redis does not answer when the bank is opened.
    """

    def __init__(self, cfg: BankConfig, embedder: Embedder | None = None) -> None:
        if cfg.redis is None:
            raise MemoryBankError("backend 'redis' needs a redis section with at least url")
        super().__init__(cfg, embedder)
        self.rcfg = cfg.redis
        self.url = redact(self.rcfg.url)
        self.client = connect(self.rcfg)
        prefix = f"{self.rcfg.key_prefix}:{cfg.name}"
        self._keys = {"records": f"{prefix}:records", "log": f"{prefix}:log",
                      "meta": f"{prefix}:meta", "trimmed": f"{prefix}:trimmed"}
        self._put = self.client.register_script(_PUT)
        self._del = self.client.register_script(_DEL)
        self._trim = self.client.register_script(_TRIM)
        self._calls = 0
        self._pending: deque[tuple[str, list]] = deque()
        self._send_lock = threading.Lock()  # keeps writes in order between callers and flusher
        self._follow_lock = threading.RLock()
        self._flusher: threading.Thread | None = None
        self._wake = threading.Event()
        self.last_error: str | None = None
        self._last_id = "0-0"
        try:
            self._check_meta()
            self._bootstrap()
        except DOWN_ERRORS as exc:
            raise BackendUnavailableError(
                f"Redis at {self.url} stopped answering while bank {self.name!r} opened ({exc})"
            ) from None

    def _check_meta(self) -> None:
        meta = self._keys["meta"]
        self.client.hsetnx(meta, "dim", self.dim)
        self.client.hsetnx(meta, "embedder", self.cfg.embedder)
        dim = int(self.client.hget(meta, "dim"))
        if dim != self.dim:
            raise DimensionError(
                f"Redis bank {self.name!r} at {self.url} holds {dim}-d vectors but this worker's "
                f"embedder gives {self.dim}-d; use the same embedder and dim everywhere"
            )

    def _bootstrap(self) -> None:
        """Loads every record, then follows the log from the point the load started."""
        self._load_all()
        self._follow()

    def _load_all(self) -> None:
        trimmed = int(self.client.get(self._keys["trimmed"]) or 0)
        last = self.client.xrevrange(self._keys["log"], count=1)
        # Taken *before* the scan: entries after it are replayed, and puts/deletes are idempotent.
        # Never before the trim cut, or the next read would think it fell behind.
        start = _id(last[0][0].decode()) if last else (0, 0)
        start = max(start, (trimmed - 1, _MAX_SEQ) if trimmed else (0, 0))
        records, vecs = [], []
        for _, data in self.client.hscan_iter(self._keys["records"], count=1000):
            rec, vec = _unpack(data, self.dim)
            records.append(rec)
            vecs.append(vec)
        with self._follow_lock:
            self._last_id = f"{start[0]}-{start[1]}"
            self.store.clear()
            if records:
                self.store.add(records, np.stack(vecs))
            # Writes still queued for Redis stay visible here (read-your-writes).
            for op, payload in list(self._pending):
                if op == "put":
                    self.store.add([r for r, _ in payload], np.stack([v for _, v in payload]))
                else:
                    self.store.remove(payload)

    # ---- following the shared log ------------------------------------------------------------
    def _follow(self) -> None:
        """Applies the log entries this worker has not seen yet."""
        with self._follow_lock:
            while True:
                pipe = self.client.pipeline(transaction=False)
                pipe.get(self._keys["trimmed"])
                pipe.xread({self._keys["log"]: self._last_id}, count=5000)
                trimmed, reply = pipe.execute()
                if trimmed and _id(self._last_id) < (int(trimmed) - 1, _MAX_SEQ):
                    log.info("bank %r fell behind the log's retention; reloading", self.name)
                    self._load_all()
                    continue
                if not reply:
                    return
                entries = reply[0][1]
                self._apply_entries(entries)
                self._last_id = entries[-1][0].decode()
                if len(entries) < 5000:
                    return

    def trim_log(self) -> int:
        """Drops log entries older than ``log_retention_s`` (also done every 200 writes).

        Returns:
            The cut in Unix milliseconds (entries before it are gone); 0 if none yet.
        """
        keys = [self._keys["log"], self._keys["trimmed"]]
        return int(self._trim(keys=keys, args=[int(self.rcfg.log_retention_s * 1000)]))

    def _apply_entries(self, entries: list) -> None:
        # Fetch all payloads of this batch in one round trip, then apply in log order.
        put_ids = [f[b"id"].decode() for _, f in entries if f[b"op"] == b"put"]
        wanted = [i for i in dict.fromkeys(put_ids) if i not in self.store]
        fetched = self.client.hmget(self._keys["records"], wanted) if wanted else []
        payloads = dict(zip(wanted, fetched, strict=True))
        batch: list[tuple[Record, np.ndarray]] = []  # consecutive puts, added in one call

        def add_batch() -> None:
            if batch:
                self.store.add([r for r, _ in batch], np.stack([v for _, v in batch]))
                batch.clear()

        for _, fields in entries:
            rec_id = fields[b"id"].decode()
            if fields[b"op"] == b"del":
                add_batch()
                self.store.remove([rec_id])
            elif payloads.get(rec_id) is not None:
                batch.append(_unpack(payloads[rec_id], self.dim))
        add_batch()

    def _sync(self) -> None:
        try:
            self._follow()
        except DOWN_ERRORS as exc:
            # Redis is down: serve the local copy (it has every local write) rather than fail.
            self._note_down(exc)

    # ---- writes ------------------------------------------------------------------------------
    def _commit_puts(self, records: list[Record], vecs: np.ndarray) -> None:
        self.store.add(records, vecs)  # read-your-writes, even while Redis is down
        for start in range(0, len(records), _CHUNK):
            chunk = list(zip(records[start:start + _CHUNK], vecs[start:start + _CHUNK]))
            self._send("put", chunk)

    def _commit_deletes(self, ids: list[str]) -> None:
        self.store.remove(ids)
        for start in range(0, len(ids), _CHUNK):
            self._send("del", ids[start:start + _CHUNK])

    def _send(self, op: str, payload: list) -> None:
        with self._send_lock:
            if self._pending:  # keep order: nothing overtakes a buffered write
                self._buffer(op, payload)
                return
            try:
                self._call(op, payload)
            except DOWN_ERRORS as exc:
                self._note_down(exc)
                self._buffer(op, payload)

    def _call(self, op: str, payload: list) -> None:
        keys = [self._keys["records"], self._keys["log"]]
        if op == "put":
            args: list = []
            for rec, vec in payload:
                args += [rec.id, _pack(rec, vec)]
            self._put(keys=keys, args=args)
        else:
            self._del(keys=keys, args=payload)
        self._calls += 1
        if self._calls % _TRIM_EVERY == 0:
            self.trim_log()

    def _note_down(self, exc: BaseException) -> None:
        if self.last_error is None:
            log.warning("Redis at %s is unreachable (%s); buffering writes", self.url, exc)
        self.last_error = str(exc)

    def _buffer(self, op: str, payload: list) -> None:
        queued = sum(len(p) for _, p in self._pending)
        if queued + len(payload) > self.rcfg.max_buffer:
            raise BackendUnavailableError(
                f"Redis at {self.url} has been unreachable for {queued} buffered writes "
                f"(max_buffer {self.rcfg.max_buffer}); restart it or raise memory.redis.max_buffer"
            )
        self._pending.append((op, payload))
        if self._flusher is None or not self._flusher.is_alive():
            self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                             name=f"memory-flush-{self.name}")
            self._flusher.start()
        self._wake.set()

    def _flush_once(self) -> bool:
        """Sends buffered writes in order; True when the buffer is empty."""
        with self._send_lock:
            while self._pending:
                op, payload = self._pending[0]
                try:
                    self._call(op, payload)
                except DOWN_ERRORS as exc:
                    self._note_down(exc)
                    return False
                self._pending.popleft()
            if self.last_error is not None:
                log.warning("Redis at %s is back; buffered writes delivered", self.url)
            self.last_error = None
            return True

    def _flush_loop(self) -> None:
        while not self.closed:
            if self._flush_once():
                return
            self._wake.wait(self.rcfg.retry_interval_s)
            self._wake.clear()

    @property
    def pending(self) -> int:
        """Records (or deletes) written locally but not yet stored in Redis."""
        return sum(len(p) for _, p in list(self._pending))

    def flush(self, timeout_s: float = 10.0) -> None:
        """Waits until every buffered write is in Redis.

        Raises:
            BackendUnavailableError: Redis stayed unreachable for ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        while not self._flush_once():
            if time.monotonic() >= deadline:
                raise BackendUnavailableError(
                    f"Redis at {self.url} is unreachable; {self.pending} writes of bank "
                    f"{self.name!r} are still buffered ({self.last_error})"
                )
            time.sleep(min(self.rcfg.retry_interval_s, max(deadline - time.monotonic(), 0)))

    def close(self, timeout_s: float = 10.0) -> None:
        """Delivers buffered writes (waiting up to ``timeout_s``), then disconnects.

        Raises:
            BackendUnavailableError: writes were still buffered at the deadline (they are lost).
        """
        if self.closed:
            return
        try:
            self.flush(timeout_s)
        finally:
            self.closed = True
            self._wake.set()
            self.client.close()
