"""The client side of online control (:mod:`agentrt.controller.control`): what ``agentrt ctl`` sends.

It reads ``<run_dir>/control.json`` (the endpoint's URL, and the token when the run made one)
and sends one command per request with ``Authorization: Bearer <token>``; a refusal is one
:class:`~agentrt.controller.control.ControlError` line carrying the run's own message.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path
from typing import Any

from agentrt.config.control import TOKEN_ENV
from agentrt.controller.control.config import ControlError, ENDPOINT

LOOPBACK = ("localhost", "::1")


def endpoint(run_dir: Path) -> dict[str, Any]:
    """``<run_dir>/control.json`` (ControlError: there is none, or it is unreadable)."""
    path = Path(run_dir) / ENDPOINT
    if not Path(run_dir).is_dir():
        raise ControlError(f"{run_dir} is not a folder; give the run folder of a running run")
    if not path.is_file():
        raise ControlError(f"{run_dir} has no control endpoint ({ENDPOINT}): the run is not "
                           "running, or its config does not set control.enabled: true")
    try:
        found = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ControlError(f"{path} cannot be read ({type(exc).__name__})") from None
    if not isinstance(found, dict) or "url" not in found:
        raise ControlError(f"{path} names no HTTP endpoint (control.http.enabled: false); send "
                           "commands to the run's Redis stream")
    return found


def _token_from_env(found: dict[str, Any]) -> str:
    """The token from this shell's environment, in the variable ``control.json`` names. The
    run folder may be writable by others, so the file may not pick any secret of this shell,
    nor send one elsewhere (issue 41, finding 2): the variable must be one of agentrt's
    (:data:`TOKEN_ENV`), and the URL must be on this machine."""
    name = str(found.get("token_env") or "")
    if not TOKEN_ENV.fullmatch(name):
        raise ControlError(f"control.json names the token variable {name!r}; agentrt ctl only "
                           "reads variables named AGENTRT_..., so no other secret of this shell "
                           "is sent")
    host = urllib.parse.urlsplit(str(found["url"])).hostname or ""
    if host not in LOOPBACK and not host.startswith("127."):
        raise ControlError(f"control.json points at {host!r}, not this machine; agentrt ctl "
                           f"sends the token from ${name} only to 127.0.0.1, ::1 or localhost "
                           "(reach a remote run through an SSH tunnel)")
    token = os.environ.get(name, "")
    if not token:
        raise ControlError(f"the run's control token comes from ${name}; set it in this shell")
    return token


def send(run_dir: Path, command: dict[str, Any] | None, token: str | None = None
         ) -> dict[str, Any]:
    """Sends ``command`` to the run in ``run_dir`` (None: GET /status); the reply.

    Raises:
        ControlError: no endpoint, the run is not running, a bad token or a refused command
            (the run's one-line message).
    """
    import urllib.error
    import urllib.request

    found = endpoint(run_dir)
    token = token or found.get("token") or _token_from_env(found)
    url = found["url"] + ("/commands" if command is not None else "/status")
    body = None if command is None else json.dumps(command).encode()
    request = urllib.request.Request(url, data=body, method="POST" if body else "GET",
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except (json.JSONDecodeError, AttributeError):
            message = str(exc.reason)
        raise ControlError(str(message), status=exc.code) from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ControlError(f"the run in {run_dir} is not running (nothing answers at "
                           f"{found['url']}: {reason})") from None


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """``['train.prompts_per_step=64']`` -> ``{'train.prompts_per_step': 64}`` (values as YAML)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise ControlError(f"{item!r} must look like section.field=value")
        try:
            out[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ControlError(f"{item!r}: the value is not valid YAML") from None
    return out
