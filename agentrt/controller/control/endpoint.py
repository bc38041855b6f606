"""The HTTP channel of online control: ``GET /status`` and ``POST /commands`` with a bearer
token, and the private ``control.json`` that tells ``agentrt ctl`` where it is."""

from __future__ import annotations

import hmac
import json
import logging
import os
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrt.controller.control.config import ControlError

if TYPE_CHECKING:
    from agentrt.controller.control.run import RunControl

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20  # bytes of one HTTP command


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def write_private(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` readable by this user only (0600), replacing it at once."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def handler(control: RunControl) -> type[BaseHTTPRequestHandler]:
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
