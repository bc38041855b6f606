"""The HTTP layer of ``agentrt serve``: OpenAI-compatible routes over the batcher (Starlette).

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream``:
server-sent events ending with ``data: [DONE]``), ``GET /health``; admin: ``POST /admin/load``
(hot swap) and ``GET /admin/versions``. With a token every route but /health needs
``Authorization: Bearer <token>``; the admin routes are off without a token. Every error is a
JSON body in OpenAI's shape with a 4xx status (5xx only for a failed generate call).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from pathlib import Path
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentrt.errors import AgentrtError
from agentrt.serving.batcher import Batcher, Job
from agentrt.serving.host import ModelHost, Version
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


async def _json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON ({exc})") from None


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


class Api:
    """Route handlers over one :class:`ModelHost` and its :class:`Batcher`.

    Args:
        token: Bearer token every route but /health needs; None: open, admin routes off.
        max_tokens: ``max_tokens`` of a request that gives none.
        max_queue: Queued prompts past which a request is refused with 503.
    """

    def __init__(self, host: ModelHost, batcher: Batcher, token: str | None = None,
                 max_tokens: int = 64, max_queue: int = 4096) -> None:
        self.host, self.batcher, self.token = host, batcher, token
        self.max_tokens, self.max_queue = max_tokens, max_queue

    def app(self) -> Starlette:
        routes = [Route("/health", self.health), Route("/v1/models", self.models),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                  Route("/admin/load", self.admin_load, methods=["POST"]),
                  Route("/admin/versions", self.admin_versions)]
        handlers = {RequestError: self._request_error, HTTPException: self._http_error,
                    Exception: self._server_error}
        return Starlette(routes=routes, exception_handlers=handlers)  # type: ignore[arg-type]

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
        return JSONResponse(error_body(_first_line(exc), "server_error", None, 500),
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
        body = await _json(request)
        if not isinstance(body, dict) or not all(isinstance(body.get(k), str)
                                                 for k in ("model", "path")):
            raise RequestError('the body must be {"model": NAME, "path": FOLDER}')
        name, path = body["model"], Path(body["path"])
        if name not in self.host.current:
            raise RequestError(f"the model {name!r} is not served here", 404, "model",
                               "not_found_error")
        try:
            staged = await asyncio.to_thread(self.host.stage, name, path)
            version = await asyncio.wrap_future(
                self.batcher.call(lambda: self.host.commit(staged)))
        except AgentrtError as exc:
            raise RequestError(str(exc), param="path") from None
        except Exception as exc:  # noqa: BLE001 - unreadable weights are the caller's input
            raise RequestError(f"cannot load {path}: {_first_line(exc)}", param="path") from None
        log.info("%s: version %d from %s", name, version.number, path)
        return JSONResponse({"model": name, "version": version.number,
                             "fingerprint": version.fingerprint, "path": str(path)})

    # ------------------------------------------------------------------ generation
    async def _complete(self, request: Request, chat: bool) -> Response:
        self._auth(request)
        p = parse(await _json(request), chat, self.host.tokenizer, self.host.max_len,
                  self.max_tokens)
        if self.batcher.queued >= self.max_queue:
            raise RequestError(f"the server has {self.batcher.queued} prompts queued; retry "
                               "later", 503, kind="server_busy")
        version = self.host.acquire(p.model, len(p.prompts))  # bound until answered
        headers = {"x-agentrt-version": str(version.number),
                   "x-agentrt-fingerprint": version.fingerprint}
        if p.stream:
            return StreamingResponse(self._stream(p, version, chat), headers=headers,
                                     media_type="text/event-stream")
        futures = [self.batcher.submit(Job(version, prompt, p.sampling)) for prompt in p.prompts]
        outs = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        tokenizer = version.module.tokenizer
        choices, generated = [], 0
        for i, out in enumerate(outs):
            text = TextStream(tokenizer, p.stop)
            content = text.complete(out.response_ids)
            choices.append(choice(chat, i, content, finish_reason(out.finished, text)))
            generated += len(out.response_ids)
        prompt_tokens = sum(len(x) for x in p.prompts)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                 "total_tokens": prompt_tokens + generated}
        return JSONResponse(body_of(chat, p.model, version.fingerprint, new_id(chat), choices,
                                    usage), headers=headers)

    async def _stream(self, p: Params, version: Version, chat: bool) -> AsyncIterator[str]:
        """Server-sent events: chunks as tokens are generated, then ``data: [DONE]``."""
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue[int | None] = asyncio.Queue()
        job = Job(version, p.prompts[0], p.sampling,
                  on_token=lambda t: loop.call_soon_threadsafe(tokens.put_nowait, t))
        self.batcher.submit(job).add_done_callback(
            lambda _: loop.call_soon_threadsafe(tokens.put_nowait, None))
        rid, text = new_id(chat), TextStream(version.module.tokenizer, p.stop)

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
            yield _sse(error_body(_first_line(exc), "server_error", None, 500))
        else:
            yield chunk(text.finish(), finish_reason(out.finished, text))
        yield _sse("[DONE]")


def started_line(host: ModelHost, url: str, backend: str) -> str:
    names = ", ".join(f"{n} (v{v.number})" for n, v in sorted(host.current.items()))
    return f"agentrt serve: {names} on {url} (backend {backend}; started {time.strftime('%X')})"
