"""The run's side of online control: its channels, the queue of checked commands, and their
application at step boundaries."""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import secrets
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agentrt.config.control import ControlConfig
from agentrt.controller.control.config import ControlError, ENDPOINT
from agentrt.controller.control.endpoint import handler, url_host, write_private
from agentrt.controller.control.feedback import feedback_groups
from agentrt.controller.control.stream import read_stream
from agentrt.core.errors import ConfigError

log = logging.getLogger(__name__)


class RunControl:
    """The control channels of one run and the queue the controller applies at step starts.

    Every run of every kind has one: with ``control.enabled: false`` it opens no channel but
    still restores the live values a checkpoint holds and keeps ``step_interval_s``.

    Args:
        cfg: The run's ``control:`` section.
        work: The run's workload (:class:`agentrt.controller.workload.Workload`): its config is
            the base the live values apply to; it names them (``live_fields``), takes them
            through ``reconfigure`` and says which commands it cannot take (``refusal``).
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
                                             handler(self))
            self._http.daemon_threads = True
            host, port = self._http.server_address[:2]
            endpoint |= {"url": f"http://{url_host(str(host))}:{port}",
                         "token_env": self.cfg.token_env}
            if not from_env:
                endpoint["token"] = self.token
            threading.Thread(target=self._http.serve_forever, name="agentrt-control-http",
                             daemon=True).start()
        if self.cfg.redis is not None:
            endpoint["redis_stream"] = self.cfg.redis.stream
            self._redis_thread = threading.Thread(
                target=read_stream, args=(self.cfg.redis, self._stop, self.receive), daemon=True,
                name="agentrt-control-redis")
            self._redis_thread.start()
        write_private(self.run_dir / ENDPOINT, json.dumps(endpoint, indent=1) + "\n")
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
        live = self.work.live_fields()
        for key in values:
            if key not in live:
                raise ControlError(f"{key} cannot be changed while the run runs; live fields: "
                                   f"{', '.join(live)}")
        self.validated({**self.live, **values})
        return {"values": dict(values)}

    def validated(self, live: dict[str, Any]) -> Any:
        """The train config with ``live`` values over the run's own (ControlError: refused)."""
        from agentrt.config.context import check_contexts
        from agentrt.config.load import validate_config

        data = json.loads(json.dumps(self.base))
        for key, value in live.items():
            node = data
            *parents, name = key.split(".")
            for part in parents:  # policies.0.optim: a list's item by its index
                node = node[int(part)] if isinstance(node, list) else node[part]
            node[name] = value
        try:
            cfg = validate_config(data, type(self.work.cfg))  # the CLI's adds imports
            check_contexts(cfg)  # a max_new_tokens no prompt fits would train nothing
            return cfg
        except ConfigError as exc:
            raise ControlError(f"refused, nothing changed: {exc}") from None

    def _check_feedback(self, command: dict[str, Any]) -> dict[str, Any]:
        from agentrt.controller.episodes import EpisodeLog

        self._refuse("feedback")
        eid, value = command.get("episode"), command.get("value")
        if not isinstance(eid, str):
            raise ControlError('feedback needs "episode": an episode id like "s12-3"')
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value):
            raise ControlError(f"feedback value must be a finite number, not {value!r}")
        if EpisodeLog(self.run_dir).get(eid) is None:
            raise ControlError(f"no episode {eid!r} in {self.run_dir}'s episode log (ids look "
                               "like s<step>-<index>; agentrt debug lists a run's)", status=404)
        return {"episode": eid, "value": float(value)}

    def _refuse(self, command: str) -> None:
        why = self.work.refusal(command)
        if why is not None:
            raise ControlError(f"{command} is refused: {why}")

    def _check_inject(self, command: dict[str, Any]) -> dict[str, Any]:
        self._refuse("inject")
        prompts = command.get("prompts")
        if not isinstance(prompts, list) or not prompts or not all(
                isinstance(p, dict) and isinstance(p.get("prompt"), str) and p["prompt"].strip()
                and isinstance(p.get("info", {}), dict) for p in prompts):
            raise ControlError('inject needs "prompts": [{"prompt": text, "answer": text?, '
                               '"info": {...}?}, ...]')
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
        data = dict(data)
        for pid in dict.fromkeys(t.policy_id for t in trajs):  # to the policy that played them
            data[pid] = [*data.get(pid, []), *(t for t in trajs if t.policy_id == pid)]
        return data, metrics

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"live": dict(self.live), "feedback": dict(self.feedback)}

    def load_state_dict(self, ctl: Any, state: dict[str, Any] | None) -> None:
        """Restores the live values (applied to the workload and policy at once)."""
        if not state:
            return
        self.feedback = dict(state.get("feedback") or {})
        fields = self.work.live_fields()
        live = {k: v for k, v in (state.get("live") or {}).items() if k in fields}
        if live:
            self.live = live
            self.work.reconfigure(ctl, self.validated(live))
            log.info("control: live values of the checkpoint kept: %s", live)
