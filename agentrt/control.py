"""Online control of a running ``agentrt train`` run, without a restart (docs/control.md).

Configured by ``control:`` in a train config (:class:`ControlConfig`, off by default). Commands
come in through a small HTTP endpoint (bearer token; 127.0.0.1 by default) and, optionally, a
Redis stream. A receiving thread checks each command at once (a bad value or an unknown episode
is refused with one message, nothing queued) and queues it; the controller applies the queue
only at a step boundary, the start of the next step, never mid-step (:meth:`RunControl.step_start`).

Commands (JSON objects; ``agentrt ctl RUN_DIR ...`` sends them):

- ``{"cmd": "set", "values": {"train.prompts_per_step": 64}}``: a live field of :data:`LIVE`,
  validated with the whole config (pydantic) as if written in the YAML;
- ``{"cmd": "feedback", "episode": "s12-3", "value": 1.0}``: a late reward for an episode of the
  episode log (:mod:`agentrt.episodes`). At the next step boundary it replaces the episode's
  logged reward and the episode's prompt group (its siblings from the log, with their logged
  rewards or their own feedback) is trained once more in that step's batch, as a group of its
  own, so a group-relative baseline (GRPO, RLOO) sees the corrected reward. An episode more than
  ``feedback.max_staleness`` steps older than that step is logged and dropped (counted);
- ``{"cmd": "inject", "prompts": [{"prompt": "2+2=", "answer": "4"}]}``: prompts the next
  steps draw before their source's;
- ``{"cmd": "pause", "at_step": 12}`` (``at_step`` optional) and ``{"cmd": "resume"}``: hold
  the loop at a step boundary; commands sent meanwhile apply at that boundary.

Every applied change is a metric of that step's row of metrics.jsonl (``control/set/<key>``,
``control/feedback/applied|dropped|trained``, ``control/inject/prompts``) and a log line. The
live values and queued prompts are part of the checkpoint, so a resume keeps them; the run's
identity (run.json) is the config it started with, so the resume is not refused.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import os
import queue
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from agentrt.errors import AgentrtError, ConfigError
from agentrt.memory.config import RedisConfig, redact
from agentrt.schema import ConfigModel

log = logging.getLogger(__name__)

ENDPOINT = "control.json"
#: Config fields a running run takes (``control.step_interval_s`` is the rollout frequency).
LIVE = ("train.prompts_per_step", "train.group_size", "policy.rollout.sampling.temperature",
        "policy.rollout.sampling.top_p", "policy.rollout.sampling.top_k",
        "policy.rollout.sampling.max_new_tokens", "policy.optim.lr", "eval.every",
        "checkpoint.every", "control.step_interval_s")
MAX_BODY = 1 << 20  # bytes of one HTTP command


class ControlHttpConfig(ConfigModel):
    enabled: bool = Field(True, description="Serve the HTTP control endpoint.")
    host: str = Field("127.0.0.1", description="Address it binds (0.0.0.0 exposes it to the "
                      "network; the token is then all that guards the run).")
    port: int = Field(0, ge=0, le=65535, description="TCP port; 0: a free one (control.json "
                      "says which).")


class ControlRedisConfig(RedisConfig):
    """A Redis stream of commands (one ``json`` field each); replies go to ``<stream>:replies``."""

    stream: str = Field("agentrt:control", min_length=1, description="Stream of commands.")


class FeedbackConfig(ConfigModel):
    max_staleness: int = Field(
        8, ge=0, description="Feedback for an episode more than this many steps older than the "
        "step it would join is logged and dropped.")
    max_groups_per_step: int = Field(
        64, gt=0, description="Prompt groups replayed for feedback in one step (they add rows "
        "to its batch); the rest, newest last, wait for the next step.")


class ControlConfig(ConfigModel):
    """Online control of a running train run (agentrt.control, docs/control.md)."""

    enabled: bool = Field(False, description="Take commands while the run runs.")
    http: ControlHttpConfig = Field(default_factory=ControlHttpConfig)
    token_env: str = Field(
        "AGENTRT_CTL_TOKEN", min_length=1, description="Environment variable holding the "
        "HTTP token; unset: a random token is made at start and written to control.json (0600).")
    redis: ControlRedisConfig | None = Field(
        None, description="Also read commands from a Redis stream ({url, stream}); None: no.")
    feedback: FeedbackConfig = Field(default_factory=FeedbackConfig)
    start_paused: bool = Field(
        False, description="Hold before the first step until `agentrt ctl RUN_DIR resume` (set "
        "values or a later pause first).")
    step_interval_s: float = Field(
        0.0, ge=0.0, description="Rollout frequency: at least this many seconds from the start "
        "of one step to the start of the next (the loop waits at the boundary); 0: no wait.")

    @model_validator(mode="after")
    def _a_channel(self) -> ControlConfig:
        if self.enabled and not self.http.enabled and self.redis is None:
            raise ValueError("control.enabled needs a channel: keep control.http.enabled or "
                             "set control.redis")
        return self


class ControlError(AgentrtError):
    """A control command is refused, or the run cannot be reached."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------- the run's side
class RunControl:
    """The control channels of one run and the queue the controller applies at step starts.

    Every train run has one: with ``control.enabled: false`` it opens no channel but still
    restores the live values a checkpoint holds and keeps ``step_interval_s``.

    Args:
        cfg: The run's ``control:`` section.
        work: The train workload (:class:`agentrt.trainer.PromptWorkload`): its config is the
            base the live values apply to; it takes them through ``reconfigure``.
    """

    def __init__(self, cfg: ControlConfig, work: Any) -> None:
        self.cfg, self.work = cfg, work
        self.base = work.cfg.model_dump(mode="json")
        self.live: dict[str, Any] = {}  # key -> value applied (checkpointed)
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.step = 0  # the step the next boundary starts
        self.paused_at: int | None = None
        self.pause_at: int | None = 1 if cfg.enabled and cfg.start_paused else None
        self.seq = 0
        self.counts = {"received": 0, "applied": 0, "refused": 0}
        self.last_start: float | None = None
        self._lock = threading.Lock()
        self._http: ThreadingHTTPServer | None = None
        self._redis_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.token = ""
        self.feedback: dict[str, float] = {}  # episode id -> value, applied at the next train

    # ------------------------------------------------------------------ channels
    def start(self, ctl: Any) -> None:
        """Starts the channels and writes ``<run_dir>/control.json``."""
        self.run_dir = Path(ctl.run_dir.path)
        self.step = ctl.step + 1
        if not self.cfg.enabled:
            return
        endpoint: dict[str, Any] = {"pid": os.getpid()}
        if self.cfg.http.enabled:
            from_env = os.environ.get(self.cfg.token_env, "")
            self.token = from_env or secrets.token_urlsafe(32)
            self._http = ThreadingHTTPServer((self.cfg.http.host, self.cfg.http.port),
                                             _handler(self))
            self._http.daemon_threads = True
            host, port = self._http.server_address[:2]
            endpoint |= {"url": f"http://{_url_host(str(host))}:{port}",
                         "token_env": self.cfg.token_env}
            if not from_env:
                endpoint["token"] = self.token
            threading.Thread(target=self._http.serve_forever, name="agentrt-control-http",
                             daemon=True).start()
        if self.cfg.redis is not None:
            endpoint["redis_stream"] = self.cfg.redis.stream
            self._redis_thread = threading.Thread(target=self._read_redis, daemon=True,
                                                  name="agentrt-control-redis")
            self._redis_thread.start()
        _write_private(self.run_dir / ENDPOINT, json.dumps(endpoint, indent=1) + "\n")
        log.info("control: %s", endpoint.get("url", f"redis stream {endpoint.get('redis_stream')}"))

    def close(self) -> None:
        self._stop.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self.cfg.enabled and hasattr(self, "run_dir"):
            (self.run_dir / ENDPOINT).unlink(missing_ok=True)
        if self._redis_thread is not None:
            self._redis_thread.join(timeout=5)

    def _read_redis(self) -> None:
        """Reads the stream from its end (commands sent before the run started are not
        applied) and replies to ``<stream>:replies`` with each command's result."""
        from agentrt.memory.redis_bank import connect

        assert self.cfg.redis is not None
        stream = self.cfg.redis.stream
        try:
            client = connect(self.cfg.redis)
            last = client.xinfo_stream(stream)["last-generated-id"] if client.exists(stream) \
                else "0-0"
        except Exception as exc:  # noqa: BLE001 - a dead Redis is a warning; HTTP goes on
            log.warning("control: redis %s unavailable (%s); its commands are not read",
                        redact(self.cfg.redis.url), exc)
            return
        while not self._stop.is_set():
            try:
                found = client.xread({stream: last}, count=100, block=500)
            except Exception as exc:  # noqa: BLE001
                log.warning("control: reading %s failed (%s); retrying", stream, exc)
                time.sleep(1.0)
                continue
            for _, entries in found or []:
                for entry_id, fields in entries:
                    last = entry_id
                    try:
                        raw = fields.get(b"json") or fields.get("json")
                        reply = self.receive(json.loads(raw) if raw is not None else None)
                    except ControlError as exc:
                        reply = {"error": str(exc)}
                    except json.JSONDecodeError:
                        reply = {"error": "the entry's json field is not JSON"}
                    client.xadd(f"{stream}:replies", {"id": entry_id, "json": json.dumps(reply)})

    # ------------------------------------------------------------------ receiving (threads)
    def receive(self, command: Any) -> dict[str, Any]:
        """Checks ``command`` and queues it; returns the reply (ControlError: refused)."""
        if not isinstance(command, dict) or not isinstance(command.get("cmd"), str):
            raise ControlError('a command is a JSON object with "cmd": set, feedback, inject, '
                               'pause, resume or status')
        kind = command["cmd"]
        if kind == "status":
            return self.status()
        check = getattr(self, f"_check_{kind}", None)
        if check is None:
            raise ControlError(f"unknown command {kind!r}; use set, feedback, inject, pause, "
                               "resume or status")
        try:
            item = check(command)
        except ControlError:
            with self._lock:
                self.counts["refused"] += 1
            raise
        with self._lock:
            self.seq += 1
            self.counts["received"] += 1
            item = {**item, "cmd": kind, "seq": self.seq}
            self.queue.put(item)
            return {"queued": self.seq, "applies_at_step": self.step}

    def status(self) -> dict[str, Any]:
        return {"step": self.step - 1, "next_step": self.step, "paused": self.paused_at is not None,
                "live": dict(self.live), "pending": self.queue.qsize(), **self.counts}

    def _check_set(self, command: dict[str, Any]) -> dict[str, Any]:
        values = command.get("values")
        if not isinstance(values, dict) or not values:
            raise ControlError('set needs "values": {"section.field": value, ...}')
        for key in values:
            if key not in LIVE:
                raise ControlError(f"{key} cannot be changed while the run runs; live fields: "
                                   f"{', '.join(LIVE)}")
        self.validated({**self.live, **values})
        return {"values": dict(values)}

    def validated(self, live: dict[str, Any]) -> Any:
        """The train config with ``live`` values over the run's own (ControlError: refused)."""
        from agentrt.config import validate_config

        data = json.loads(json.dumps(self.base))
        for key, value in live.items():
            node = data
            *parents, name = key.split(".")
            for part in parents:
                node = node[part]
            node[name] = value
        try:
            return validate_config(data, type(self.work.cfg))  # the CLI's adds imports
        except ConfigError as exc:
            raise ControlError(f"refused, nothing changed: {exc}") from None

    def _check_feedback(self, command: dict[str, Any]) -> dict[str, Any]:
        from agentrt.episodes import EpisodeLog

        eid, value = command.get("episode"), command.get("value")
        if not isinstance(eid, str):
            raise ControlError('feedback needs "episode": an episode id like "s12-3"')
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value):
            raise ControlError(f"feedback value must be a finite number, not {value!r}")
        if self.work.offline:
            raise ControlError("this run trains on offline preference data (data.path): it plays "
                               "no episodes to give feedback on")
        if EpisodeLog(self.run_dir).get(eid) is None:
            raise ControlError(f"no episode {eid!r} in {self.run_dir}'s episode log (ids look "
                               "like s<step>-<index>; agentrt debug lists a run's)", status=404)
        return {"episode": eid, "value": float(value)}

    def _check_inject(self, command: dict[str, Any]) -> dict[str, Any]:
        prompts = command.get("prompts")
        if not isinstance(prompts, list) or not prompts or not all(
                isinstance(p, dict) and isinstance(p.get("prompt"), str) and p["prompt"].strip()
                and isinstance(p.get("info", {}), dict) for p in prompts):
            raise ControlError('inject needs "prompts": [{"prompt": text, "answer": text?, '
                               '"info": {...}?}, ...]')
        if self.work.offline:
            raise ControlError("this run trains on offline preference data: it samples no prompts")
        out = []
        for p in prompts:  # the reward reads the answer from info, as a data row's
            info = dict(p.get("info") or {})
            if p.get("answer") is not None:
                info["answer"] = str(p["answer"])
            out.append({"prompt": p["prompt"], "answer": str(p.get("answer") or ""), "info": info})
        return {"prompts": out}

    def _check_pause(self, command: dict[str, Any]) -> dict[str, Any]:
        at = command.get("at_step")
        if at is not None and (isinstance(at, bool) or not isinstance(at, int) or at < 1):
            raise ControlError(f"pause at_step must be a step number >= 1, not {at!r}")
        return {"at_step": at}

    def _check_resume(self, command: dict[str, Any]) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ applying (the loop)
    def step_start(self, ctl: Any, step: int) -> dict[str, float]:
        """At the start of ``step``: applies what is queued, holds a pause, waits out
        ``step_interval_s``; returns the step's ``control/`` metrics."""
        self.step = step
        events: dict[str, float] = {}
        self._drain(ctl, step, events)
        while self.paused_at is not None or (self.pause_at is not None and step >= self.pause_at):
            if self.paused_at is None:
                self.paused_at, self.pause_at = step, None
                log.warning("control: paused before step %d; `agentrt ctl %s resume` goes on",
                            step, self.run_dir)
            self._apply_next(ctl, step, events, timeout=0.2)
        wait_until = (self.last_start or 0.0) + self._interval()
        while time.monotonic() < wait_until:
            self._apply_next(ctl, step, events, timeout=wait_until - time.monotonic())
        self.last_start = time.monotonic()
        return events

    def _interval(self) -> float:
        return float(self.live.get("control.step_interval_s", self.cfg.step_interval_s))

    def _drain(self, ctl: Any, step: int, events: dict[str, float]) -> None:
        while not self.queue.empty():
            self._apply_next(ctl, step, events, timeout=0)

    def _apply_next(self, ctl: Any, step: int, events: dict[str, float], timeout: float) -> None:
        try:
            item = self.queue.get(timeout=timeout) if timeout > 0 else self.queue.get_nowait()
        except queue.Empty:
            return
        try:
            getattr(self, f"_apply_{item['cmd']}")(ctl, step, item, events)
            self.counts["applied"] += 1
        except ControlError as exc:  # valid when received, not with what came before it
            self.counts["refused"] += 1
            events["control/refused"] = events.get("control/refused", 0.0) + 1
            log.warning("control: command %d refused at step %d: %s", item["seq"], step, exc)

    def _apply_set(self, ctl: Any, step: int, item: dict[str, Any],
                   events: dict[str, float]) -> None:
        live = {**self.live, **item["values"]}
        cfg = self.validated(live)
        for key, value in item["values"].items():
            log.info("control: %s = %s from step %d", key, value, step)
            events[f"control/set/{key}"] = float(value)
        self.live = live
        self.work.reconfigure(ctl, cfg)

    def _apply_feedback(self, ctl: Any, step: int, item: dict[str, Any],
                        events: dict[str, float]) -> None:
        self.feedback[item["episode"]] = item["value"]  # the last value of an episode wins

    def _apply_inject(self, ctl: Any, step: int, item: dict[str, Any],
                      events: dict[str, float]) -> None:
        self.work.inject(item["prompts"])
        events["control/inject/prompts"] = events.get("control/inject/prompts", 0.0) + len(
            item["prompts"])
        log.info("control: %d prompts injected at step %d", len(item["prompts"]), step)

    def _apply_pause(self, ctl: Any, step: int, item: dict[str, Any],
                     events: dict[str, float]) -> None:
        if item["at_step"] is None or item["at_step"] <= step:
            self.paused_at = self.paused_at or step
        else:
            self.pause_at = item["at_step"]

    def _apply_resume(self, ctl: Any, step: int, item: dict[str, Any],
                      events: dict[str, float]) -> None:
        if self.paused_at is not None:
            log.warning("control: resumed at step %d", step)
        self.paused_at = None  # a pause --at-step sent meanwhile stays

    def training_data(self, step: int, data: dict[str, list[Any]]) -> tuple[
            dict[str, list[Any]], dict[str, float]]:
        """``data`` with the feedback groups of the episodes given feedback since the last
        step, and the step's ``control/feedback/`` metrics."""
        pending, self.feedback = self.feedback, {}
        if not pending:
            return data, {}
        fb = self.cfg.feedback
        trajs, metrics, self.feedback = feedback_groups(self.run_dir, pending, step,
                                                        fb.max_staleness, fb.max_groups_per_step)
        pid = self.work.pid
        return {**data, pid: list(data.get(pid, [])) + trajs}, metrics

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"live": dict(self.live), "feedback": dict(self.feedback)}

    def load_state_dict(self, ctl: Any, state: dict[str, Any] | None) -> None:
        """Restores the live values (applied to the workload and policy at once)."""
        if not state:
            return
        self.feedback = dict(state.get("feedback") or {})
        live = {k: v for k, v in (state.get("live") or {}).items() if k in LIVE}
        if live:
            self.live = live
            self.work.reconfigure(ctl, self.validated(live))
            log.info("control: live values of the checkpoint kept: %s", live)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _write_private(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` readable by this user only (0600), replacing it at once."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _handler(control: RunControl) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "agentrt-control"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
            log.debug("control http: " + format, *args)

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            given = self.headers.get("Authorization", "")
            ok = given.startswith("Bearer ") and hmac.compare_digest(
                given[7:].encode(), control.token.encode())
            if not ok:
                self._reply(401, {"error": "missing or wrong control token: send 'Authorization: "
                                  "Bearer <token>' (the token is in control.json or $"
                                  f"{control.cfg.token_env}); nothing was changed"})
            return ok

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            if self._authorized():
                if self.path.rstrip("/") == "/status":
                    self._reply(200, control.status())
                else:
                    self._reply(404, {"error": f"no route {self.path}; GET /status, POST "
                                      "/commands"})

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            if not self._authorized():
                return
            if self.path.rstrip("/") != "/commands":
                self._reply(404, {"error": f"no route {self.path}; POST /commands"})
                return
            try:
                size = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                size = -1
            if not 0 <= size <= MAX_BODY:
                self._reply(413, {"error": f"a command is 0 to {MAX_BODY} bytes (Content-Length)"})
                return
            try:
                command = json.loads(self.rfile.read(size) or b"null")
                self._reply(202, control.receive(command))
            except json.JSONDecodeError:
                self._reply(400, {"error": "the body is not JSON"})
            except ControlError as exc:
                self._reply(exc.status, {"error": str(exc)})

    return Handler


def feedback_groups(run_dir: Path, pending: dict[str, float], step: int, max_staleness: int,
                    max_groups: int) -> tuple[list[Any], dict[str, float], dict[str, float]]:
    """The trajectories a step trains on for the late rewards ``pending`` (episode id ->
    value): each episode's prompt group from the episode log, its rewards replaced where
    feedback came, as one group ``feedback|s<step>|<group>``; the ``control/feedback/``
    metrics; and the feedback deferred to the next step (the groups past the ``max_groups``
    oldest). Episodes more than ``max_staleness`` steps older than ``step`` are dropped."""
    from agentrt.episodes import EpisodeLog
    from agentrt.types import Trajectory, Turn

    episodes = EpisodeLog(run_dir)
    groups: dict[tuple[int, str], dict[str, float]] = {}
    dropped = 0
    for eid, value in pending.items():
        ep = episodes.get(eid)
        if ep is None or step - ep.step > max_staleness:
            dropped += 1
            log.warning("control: feedback for %s dropped at step %d (%s)", eid, step,
                        "no longer in the log" if ep is None else
                        f"{step - ep.step} steps old > feedback.max_staleness {max_staleness}")
            continue
        groups.setdefault((ep.step, ep.group_id), {})[eid] = value
    ordered = sorted(groups.items())  # oldest first: they go stale first
    deferred = {eid: v for _, values in ordered[max_groups:] for eid, v in values.items()}
    groups = dict(ordered[:max_groups])
    trajs = []
    for (at, group), values in groups.items():
        for ep in episodes.rows(at):
            if ep.group_id != group:
                continue
            turn = Turn(ep.prompt_ids, ep.response_ids, ep.logprobs,
                        reward=values.get(ep.id, ep.reward), policy_id=ep.policy_id,
                        policy_version=ep.policy_version, finished=ep.finished)
            trajs.append(Trajectory([turn], group_id=f"feedback|s{at}|{group}", episode_id=ep.id,
                                    policy_id=ep.policy_id, info={"feedback": ep.id in values}))
    applied = sum(len(v) for v in groups.values())
    if applied:
        log.info("control: feedback for %d episodes joins step %d (%d groups, %d episodes "
                 "trained again)", applied, step, len(groups), len(trajs))
    return trajs, {"control/feedback/applied": float(applied),
                   "control/feedback/dropped": float(dropped),
                   "control/feedback/deferred": float(len(deferred)),
                   "control/feedback/groups": float(len(groups)),
                   "control/feedback/trained": float(len(trajs))}, deferred
