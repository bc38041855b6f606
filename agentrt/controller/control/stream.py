"""The Redis channel of online control: commands from a stream, replies to ``<stream>:replies``."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable

from agentrt.config.control import ControlRedisConfig
from agentrt.controller.control.config import ControlError
from agentrt.core.urls import redact

log = logging.getLogger(__name__)


def read_stream(cfg: ControlRedisConfig, stop: threading.Event,
                receive: Callable[[Any], dict[str, Any]]) -> None:
    """Reads the stream from its end (commands sent before the run started are not
    applied) and replies to ``<stream>:replies`` with each command's result."""
    from agentrt.memory.redis_bank import connect

    stream = cfg.stream
    try:
        client = connect(cfg)
        last = client.xinfo_stream(stream)["last-generated-id"] if client.exists(stream) \
            else "0-0"
    except Exception as exc:  # noqa: BLE001 - a dead Redis is a warning; HTTP goes on
        log.warning("control: redis %s unavailable (%s); its commands are not read",
                    redact(cfg.url), exc)
        return
    while not stop.is_set():
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
                    reply = receive(json.loads(raw) if raw is not None else None)
                except ControlError as exc:
                    reply = {"error": str(exc)}
                except json.JSONDecodeError:
                    reply = {"error": "the entry's json field is not JSON"}
                client.xadd(f"{stream}:replies", {"id": entry_id, "json": json.dumps(reply)})
