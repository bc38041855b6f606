"""``agentrt serve``: load what a target holds, start the batcher, answer HTTP until stopped."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any, Sequence

from agentrt.core.errors import AgentrtError

log = logging.getLogger(__name__)
TOKEN_ENV = "AGENTRT_SERVE_TOKEN"


def _bind(host: str, port: int) -> socket.socket:
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET  # a host name
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise AgentrtError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another "
                           "--port (0: any free port)") from None
    sock.listen(2048)  # connections queue from now on, before uvicorn starts (uvicorn's backlog)
    return sock


def canary_defaults(**options: Any) -> dict[str, Any]:
    """The ``--canary-*`` options that are set, checked as canary settings (docs/serving.md).

    Raises:
        AgentrtError: one line naming the first bad option.
    """
    from pydantic import ValidationError

    from agentrt.serving.canary_stats import CanaryTest
    from agentrt.core.schema import format_validation_error

    given = {k: v for k, v in options.items() if v is not None}
    try:
        CanaryTest(**given)
    except ValidationError as exc:
        raise AgentrtError(f"--canary-{format_validation_error(exc)}") from None
    return given


def _check_choice(flag: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise AgentrtError(f"{flag} takes {' or '.join(valid)}, not {value!r}")


def _check_options(backend: str, device: str | None, max_batch: int, max_tokens: int,
                   max_request_mb: float, threads: int | None, port: int) -> None:
    """serve's numbers and choices, each refused in one line naming its option."""
    _check_choice("--backend", backend, ("hf", "vllm"))
    _check_choice("--device", device or "auto", ("auto", "cpu", "cuda"))
    if max_batch < 1 or max_tokens < 1:
        raise AgentrtError("--max-batch and --max-tokens must be at least 1")
    if not 0.001 <= max_request_mb <= 4096:
        raise AgentrtError(f"--max-request-mb takes 0.001 to 4096, not {max_request_mb:g}")
    if threads is not None and not 1 <= threads <= 1024:
        raise AgentrtError(f"--threads takes 1 to 1024, not {threads}")
    if not 0 <= port <= 65535:
        raise AgentrtError(f"--port {port} is not a TCP port (0-65535; 0: any free port)")


def _canary_settings(canary: dict[str, Any] | None, scorer: str | None,
                     canary_log: Path) -> dict[str, Any]:
    """The ``--canary-*`` defaults, checked (one error line each)."""
    canary = canary_defaults(**(canary or {}))
    if scorer is not None:
        from agentrt.rewards import resolve_reward

        resolve_reward(scorer, "--canary-scorer")  # an unknown one: refused before any load
        canary["scorer"] = scorer
    if canary_log.is_dir():
        raise AgentrtError(f"--canary-log {canary_log} is a folder; give a file path")
    return canary


def _sources(target: Path, adapters: Sequence[str], base: Path | None, name: str | None,
             canary: dict[str, Any], follow: bool, poll_s: float) -> tuple[list[Any], Any]:
    """What to serve, and the :class:`~agentrt.serving.follow.Follower` with ``follow``."""
    from agentrt.serving.sources import find_sources

    if not follow:
        return find_sources(target, adapters, base, name), None
    from agentrt.serving.follow import Follower

    if adapters or name:
        raise AgentrtError("--follow serves a run's policies: drop --adapter and --name")
    follower = Follower(target, canary, poll_s)
    return follower.sources(), follower


def _start(sources: list[Any], backend: str, max_batch: int, device: str,
           threads: int | None) -> tuple[Any, Any]:
    """Loads the models and starts the batcher (torch threads set, or tuned on its thread)."""
    from agentrt.runtime.threads import ThreadTuner, forward_probe, set_threads, threads_auto
    from agentrt.serving.batcher import Batcher
    from agentrt.serving.host import ModelHost

    set_threads(threads)
    models = ModelHost(sources, backend, max_batch, device=device)
    batcher = Batcher(models, max_batch).start()  # its thread takes the count (apply_threads)
    model = models.probe_model()
    if threads_auto() and model is not None:  # timed on the thread that generates
        probe = forward_probe(model, len(models.tokenizer(next(iter(models.current)))))
        batcher.call(lambda: ThreadTuner(probe, every=0).tune()).result()
    return models, batcher


def serve(target: Path, adapters: Sequence[str] = (), base: Path | None = None,
          name: str | None = None, host: str = "127.0.0.1", port: int = 8000,
          token: str | None = None, backend: str = "hf", max_batch: int = 32,
          max_tokens: int = 64, canary: dict[str, Any] | None = None,
          canary_log: Path = Path("canary.jsonl"), threads: int | None = None,
          device: str | None = None, max_request_mb: float = 8.0, follow: bool = False,
          follow_poll_s: float = 1.0, canary_scorer: str | None = None) -> None:
    """Serves ``target``'s models until interrupted (see docs/serving.md); ``canary`` holds
    the settings a ``POST /admin/canary`` body leaves out (:func:`canary_defaults`);
    ``threads`` pins torch's threads, None tunes them once on the first model
    (:mod:`agentrt.runtime.threads`); ``device`` (auto, cpu, cuda) places the HF backend's
    models, None: a run folder's ``model.device``, else auto. ``follow``: ``target`` is a run
    that is still training; its newest checkpoint is served and each newer one tried through a
    canary (:mod:`agentrt.serving.follow`).

    Raises:
        AgentrtError: a bad target, option or port, before anything is loaded or bound.
    """
    from agentrt.serving.sources import run_device

    _check_options(backend, device, max_batch, max_tokens, max_request_mb, threads, port)
    canary = _canary_settings(canary, canary_scorer, canary_log)
    token = token or os.environ.get(TOKEN_ENV) or None
    sources, follower = _sources(target, adapters, base, name, canary, follow, follow_poll_s)
    if host not in ("127.0.0.1", "localhost", "::1") and token is None:
        log.warning("listening on %s without a token: anyone who reaches it can generate; "
                    "set %s", host, TOKEN_ENV)
    sock = _bind(host, port)
    import uvicorn

    from agentrt.serving.api import Api, started_line

    models, batcher = _start(sources, backend, max_batch, device or run_device(target), threads)
    api = Api(models, batcher, token, max_tokens, canary_log=canary_log,
              canary_defaults=canary, max_body=int(max_request_mb * (1 << 20)))
    if follower is not None:
        follower.attach(api)
    app = api.app(background=follower.run if follower is not None else None)
    url = f"http://{host}:{sock.getsockname()[1]}"
    print(started_line(models, url, backend), file=sys.stdout, flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False,
                            lifespan="off" if follower is None else "on")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        batcher.stop()
        models.close()
        sock.close()
