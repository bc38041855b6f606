"""The HTTP layer of ``agentrt serve``: OpenAI-compatible routes over the batcher (Starlette).

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream``:
server-sent events ending with ``data: [DONE]``), ``GET /health``; admin: ``POST /admin/load``
(hot swap), ``GET /admin/versions``, ``POST|GET /admin/canary`` (agentrt.serving.canary), and
``POST /v1/feedback`` (a response's reward for a canary). With a token every route but /health needs
``Authorization: Bearer <token>``; the admin routes are off without a token. Every error is a
JSON body in OpenAI's shape with a 4xx status (5xx only for a failed generate call).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentrt.serving.canary_stats import Arm
from agentrt.core.errors import AgentrtError
from agentrt.serving.batcher import Batcher, Job
from agentrt.serving.canary import CanaryLog, CanaryRun
from agentrt.serving.canary_routes import CanaryRoutes
from agentrt.serving.host import ModelHost, Version
from agentrt.serving.http import first_line, read_json
from agentrt.serving.protocol import (
    Params,
    RequestError,
    TextStream,
    body_of,
    choice,
    error_body,
    finish_reason,
    new_id,
    parse,
)

log = logging.getLogger(__name__)


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def _running(background: Callable[[], Awaitable[None]]) -> Any:
    """A Starlette lifespan that runs ``background()`` as a task while the app serves."""
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(background())
        yield
        task.cancel()

    return lifespan


class Api(CanaryRoutes):
    """Route handlers over one :class:`ModelHost` and its :class:`Batcher`.

    Args:
        token: Bearer token every route but /health needs; None: open, admin routes off.
        max_tokens: ``max_tokens`` of a request that gives none.
        max_queue: Queued prompts past which a request is refused with 503 (and the most
            prompts one request may hold).
        max_body: Largest request body in bytes (413 past it).
        canary_log: The canary log (JSON lines).
        canary_defaults: ``POST /admin/canary`` settings a body leaves out.
    """

    def __init__(self, host: ModelHost, batcher: Batcher, token: str | None = None,
                 max_tokens: int = 64, max_queue: int = 4096,
                 canary_log: Path = Path("canary.jsonl"),
                 canary_defaults: dict[str, Any] | None = None,
                 max_body: int = 8 << 20) -> None:
        self.host, self.batcher, self.token = host, batcher, token
        self.max_tokens, self.max_queue, self.max_body = max_tokens, max_queue, max_body
        self.canary_log, self.canary_defaults = CanaryLog(canary_log), canary_defaults or {}
        self.canaries: dict[str, CanaryRun] = {}  # running (or deciding) per served name
        self.finished: list[CanaryRun] = []
        self._changing: set[str] = set()  # names whose version is being loaded
        self._tasks: set[asyncio.Task] = set()  # scorer tasks, referenced until done
        self.on_decided: Callable[[CanaryRun], None] | None = None  # e.g. serve --follow

    def app(self, background: Callable[[], Awaitable[None]] | None = None) -> Starlette:
        """The Starlette app; ``background()`` runs on its event loop while it serves (with
        uvicorn's ``lifespan="on"``)."""
        routes = [Route("/health", self.health), Route("/v1/models", self.models),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                  Route("/admin/load", self.admin_load, methods=["POST"]),
                  Route("/admin/versions", self.admin_versions),
                  Route("/admin/canary", self.admin_canary, methods=["GET", "POST"]),
                  Route("/v1/feedback", self.feedback, methods=["POST"])]
        handlers = {RequestError: self._request_error, HTTPException: self._http_error,
                    Exception: self._server_error}
        return Starlette(routes=routes, exception_handlers=handlers,  # type: ignore[arg-type]
                         lifespan=None if background is None else _running(background))

    # ------------------------------------------------------------------ errors and auth
    async def _request_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestError)
        return JSONResponse(exc.body(), status_code=exc.status)

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(error_body(message, "invalid_request_error", None, exc.status_code),
                            status_code=exc.status_code)

    async def _server_error(self, request: Request, exc: Exception) -> Response:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse(error_body(first_line(exc), "server_error", None, 500),
                            status_code=500)

    def _auth(self, request: Request, admin: bool = False) -> None:
        if self.token is None:
            if admin:
                raise RequestError("the admin routes are off: start agentrt serve with --token "
                                   "(or AGENTRT_SERVE_TOKEN) to use them", 403,
                                   kind="permission_error")
            return
        given = request.headers.get("authorization", "")
        if not (given.startswith("Bearer ") and
                hmac.compare_digest(given[7:].encode(), self.token.encode())):
            raise RequestError("missing or wrong token: send the header 'Authorization: Bearer "
                               "<token>' with the server's token", 401,
                               kind="authentication_error")

    # ------------------------------------------------------------------ routes
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        self._auth(request)
        data = [{"id": v["model"], "object": "model", "created": 0, "owned_by": "agentrt",
                 "version": v["version"], "fingerprint": v["fingerprint"],
                 "adapter": v["base"] is not None} for v in self.host.versions() if v["current"]]
        return JSONResponse({"object": "list", "data": data})

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def admin_versions(self, request: Request) -> Response:
        self._auth(request, admin=True)
        return JSONResponse({"versions": self.host.versions(), "queued": self.batcher.queued,
                             "batches": self.batcher.batches, "answered": self.batcher.answered})

    async def admin_load(self, request: Request) -> Response:
        """Hot swap: ``{"model": name, "path": folder}`` becomes ``name``'s new version."""
        self._auth(request, admin=True)
        body = await read_json(request, self.max_body)
        if not isinstance(body, dict) or not all(isinstance(body.get(k), str)
                                                 for k in ("model", "path")):
            raise RequestError('the body must be {"model": NAME, "path": FOLDER}')
        name, path = body["model"], Path(body["path"])
        self._free(name)
        self._changing.add(name)
        try:
            version = await self._load(name, path, candidate=False)
        finally:
            self._changing.discard(name)
        log.info("%s: version %d from %s", name, version.number, path)
        return JSONResponse({"model": name, "version": version.number,
                             "fingerprint": version.fingerprint, "path": str(path)})

    def _free(self, name: str) -> None:
        """Refuses a new version for ``name`` while it is not served or has a canary."""
        if name not in self.host.current:
            raise RequestError(f"the model {name!r} is not served here", 404, "model",
                               "not_found_error")
        if name in self.canaries or name in self._changing:
            raise RequestError(f"{name!r} has a canary running or a version loading; wait for "
                               "it (GET /admin/canary, /admin/versions)", 409, "model",
                               "conflict_error")

    async def _load(self, name: str, path: Path, candidate: bool) -> Version:
        """Loads ``path`` as ``name``'s current version or its canary candidate."""
        try:
            staged = await asyncio.to_thread(self.host.stage, name, path)
            load = self.host.add_candidate if candidate else self.host.commit
            return await asyncio.wrap_future(self.batcher.call(lambda: load(staged)))
        except AgentrtError as exc:
            raise RequestError(str(exc), param="path") from None
        except Exception as exc:  # noqa: BLE001 - unreadable weights are the caller's input
            raise RequestError(f"cannot load {path}: {first_line(exc)}", param="path") from None

    # ------------------------------------------------------------------ generation
    async def _complete(self, request: Request, chat: bool) -> Response:
        self._auth(request)
        body = await read_json(request, self.max_body)
        # tokenized off the event loop: a long prompt never stalls the other requests
        p = await asyncio.to_thread(parse, body, chat, self.host.tokenizer, self.host.max_len,
                                    self.max_tokens, self.max_queue)
        if self.batcher.queued + len(p.prompts) > self.max_queue:
            raise RequestError(f"the server has {self.batcher.queued} prompts queued; retry "
                               "later", 503, kind="server_busy")
        run = self.canaries.get(p.model)
        arm = run.route() if run is not None and run.running else None
        # bound until answered
        version = self.host.acquire(p.model, len(p.prompts), candidate=arm == "candidate")
        headers = {"x-agentrt-version": str(version.number),
                   "x-agentrt-fingerprint": version.fingerprint}
        if arm is not None:
            headers["x-agentrt-canary"] = arm
        rid = new_id(chat)
        if p.stream:
            return StreamingResponse(self._stream(p, version, chat, rid, run, arm),
                                     headers=headers, media_type="text/event-stream")
        futures = [self.batcher.submit(Job(version, prompt, p.sampling)) for prompt in p.prompts]
        outs = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        tokenizer = version.module.tokenizer
        choices, generated, texts = [], 0, []
        for i, out in enumerate(outs):
            text = TextStream(tokenizer, p.stop)
            texts.append(text.complete(out.response_ids))
            choices.append(choice(chat, i, texts[-1], finish_reason(out.finished, text)))
            generated += len(out.response_ids)
        prompt_tokens = sum(len(x) for x in p.prompts)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                 "total_tokens": prompt_tokens + generated}
        self._answered(run, arm, rid, p.prompts, texts, tokenizer)
        return JSONResponse(body_of(chat, p.model, version.fingerprint, rid, choices, usage),
                            headers=headers)

    async def _stream(self, p: Params, version: Version, chat: bool, rid: str,
                      run: CanaryRun | None, arm: Arm | None) -> AsyncIterator[str]:
        """Server-sent events: chunks as tokens are generated, then ``data: [DONE]``."""
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue[int | None] = asyncio.Queue()
        job = Job(version, p.prompts[0], p.sampling,
                  on_token=lambda t: loop.call_soon_threadsafe(tokens.put_nowait, t))
        self.batcher.submit(job).add_done_callback(
            lambda _: loop.call_soon_threadsafe(tokens.put_nowait, None))
        text = TextStream(version.module.tokenizer, p.stop)

        def chunk(piece: str | None, reason: str | None = None, first: bool = False) -> str:
            choices = [choice(chat, 0, piece, reason, delta=True, first=first)]
            return _sse(body_of(chat, p.model, version.fingerprint, rid, choices, None, True))

        if chat:
            yield chunk("", first=True)
        while (token := await tokens.get()) is not None:
            piece = text.push(token)
            if piece:
                yield chunk(piece)
        try:
            out = job.future.result()
        except Exception as exc:  # noqa: BLE001 - the status is sent already: an error event
            yield _sse(error_body(first_line(exc), "server_error", None, 500))
        else:
            yield chunk(text.finish(), finish_reason(out.finished, text))
            self._answered(run, arm, rid, p.prompts, [text.text], version.module.tokenizer)
        yield _sse("[DONE]")


def started_line(host: ModelHost, url: str, backend: str) -> str:
    names = ", ".join(f"{n} (v{v.number})" for n, v in sorted(host.current.items()))
    return f"agentrt serve: {names} on {url} (backend {backend}; started {time.strftime('%X')})"
