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
import hmac
import json
import logging
import time
from pathlib import Path
from typing import Any, AsyncIterator

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentrt.serving.canary_stats import Arm, Decision
from agentrt.core.schema import format_validation_error
from agentrt.core.errors import AgentrtError
from agentrt.rewards import RewardFn, resolve_reward, score
from agentrt.serving.batcher import Batcher, Job
from agentrt.serving.canary import CanaryConfig, CanaryLog, CanaryRun
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


async def _json(request: Request, limit: int) -> Any:
    """The request's JSON body, refused (413) past ``limit`` bytes before more is read; parsed
    off the event loop."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return await asyncio.to_thread(json.loads, raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON ({exc})") from None


def _too_large(limit: int) -> RequestError:
    return RequestError(f"the request body is larger than {limit} bytes, the most this server "
                        "takes (agentrt serve --max-request-mb)", 413)


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


class Api:
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

    def app(self) -> Starlette:
        routes = [Route("/health", self.health), Route("/v1/models", self.models),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                  Route("/admin/load", self.admin_load, methods=["POST"]),
                  Route("/admin/versions", self.admin_versions),
                  Route("/admin/canary", self.admin_canary, methods=["GET", "POST"]),
                  Route("/v1/feedback", self.feedback, methods=["POST"])]
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
        body = await _json(request, self.max_body)
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
            raise RequestError(f"cannot load {path}: {_first_line(exc)}", param="path") from None

    # ------------------------------------------------------------------ canary
    async def admin_canary(self, request: Request) -> Response:
        """GET: every canary (running first) with its events; POST: start one (CanaryConfig)."""
        self._auth(request, admin=True)
        if request.method == "GET":
            runs = [*self.canaries.values(), *reversed(self.finished)]
            return JSONResponse({"canaries": [r.status() for r in runs]})
        body = await _json(request, self.max_body)
        if not isinstance(body, dict):
            raise RequestError('the body must be {"model": NAME, "path": FOLDER, ...}')
        try:
            cfg = CanaryConfig.model_validate({**self.canary_defaults, **body})
        except ValidationError as exc:
            loc = exc.errors()[0]["loc"]
            raise RequestError(format_validation_error(exc),
                               param=str(loc[0]) if loc else None) from None
        try:
            scorer = resolve_reward(cfg.scorer) if cfg.scorer else None
        except AgentrtError as exc:
            raise RequestError(str(exc), param="scorer") from None
        self._free(cfg.model)
        self._changing.add(cfg.model)
        try:
            incumbent = self.host.current[cfg.model]
            candidate = await self._load(cfg.model, Path(cfg.path), candidate=True)
            run = CanaryRun(cfg, scorer, incumbent, candidate, self.canary_log)
            self.canaries[cfg.model] = run
        finally:
            self._changing.discard(cfg.model)
        log.info("%s: canary of %s on %.1f%% of requests", cfg.model, candidate.fingerprint,
                 100 * cfg.share)
        return JSONResponse(run.status())

    async def feedback(self, request: Request) -> Response:
        """``{"id": completion id, "reward": number}``: the reward of a canary's response."""
        self._auth(request)
        body = await _json(request, self.max_body)
        rid = body.get("id") if isinstance(body, dict) else None
        value = body.get("reward") if isinstance(body, dict) else None
        if not isinstance(rid, str) or isinstance(value, bool) or \
                not isinstance(value, (int, float)):
            raise RequestError('the body must be {"id": COMPLETION_ID, "reward": NUMBER}',
                               param="reward" if isinstance(rid, str) else "id")
        run = next((r for r in self.canaries.values() if rid in r.served), None)
        if run is None:
            raise RequestError(f"no canary waits for a reward of {rid!r}: only responses served "
                               "while a canary runs count, each once", 404, "id",
                               "not_found_error")
        if not run.running:
            raise RequestError(f"the canary of {run.cfg.model!r} has decided; this reward is not "
                               "counted", 409, "id", "conflict_error")
        try:
            decision = await self._count(run, rid, float(value), "feedback")
        except ValueError as exc:
            raise RequestError(str(exc), param="reward") from None
        return JSONResponse({"id": rid, "model": run.cfg.model, "counted": True,
                             "look": decision.record() if decision else None,
                             "state": run.state})

    async def _count(self, run: CanaryRun, rid: str, value: float, via: str) -> Decision | None:
        decision = run.reward(rid, value, via)
        if decision is not None and decision.decision != "continue":
            await self._decide(run, decision)
        return decision

    async def _decide(self, run: CanaryRun, decision: Decision) -> None:
        """Promotes the candidate through the hot-swap path, or withdraws it."""
        if decision.decision == "promote":
            fn = lambda: self.host.promote(run.candidate)  # noqa: E731
        else:
            fn = lambda: self.host.withdraw(run.candidate)  # noqa: E731
        await asyncio.wrap_future(self.batcher.call(fn))
        current = self.host.current[run.cfg.model]
        run.finish(decision, current)
        del self.canaries[run.cfg.model]
        self.finished.append(run)
        log.info("%s: canary %s %s (%s)", run.cfg.model, run.candidate.fingerprint, run.state,
                 decision.rule)

    def _answered(self, run: CanaryRun | None, arm: Arm | None, rid: str, prompts: list[list[int]],
                  texts: list[str], tokenizer: Any) -> None:
        """A canary's response was made: it waits for a reward; a scorer gives one now."""
        if run is None or arm is None or not run.running:
            return
        run.answered(rid, arm)
        if run.scorer is not None:
            task = asyncio.get_running_loop().create_task(
                self._score(run, run.scorer, rid, prompts, texts, tokenizer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _score(self, run: CanaryRun, fn: RewardFn, rid: str, prompts: list[list[int]],
                     texts: list[str], tokenizer: Any) -> None:
        samples = [(tokenizer.decode(p, skip_special_tokens=True), t,
                    {"model": run.cfg.model, "id": rid}) for p, t in zip(prompts, texts)]
        values, errors = await asyncio.to_thread(score, fn, samples)
        if errors or not run.running:
            return  # a failed score is no sample (score logged it)
        try:
            await self._count(run, rid, sum(values) / len(values), "scorer")
        except (KeyError, ValueError) as exc:
            log.warning("%s: scorer reward not counted: %s", run.cfg.model, exc)

    # ------------------------------------------------------------------ generation
    async def _complete(self, request: Request, chat: bool) -> Response:
        self._auth(request)
        body = await _json(request, self.max_body)
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
            yield _sse(error_body(_first_line(exc), "server_error", None, 500))
        else:
            yield chunk(text.finish(), finish_reason(out.finished, text))
            self._answered(run, arm, rid, p.prompts, [text.text], version.module.tokenizer)
        yield _sse("[DONE]")


def started_line(host: ModelHost, url: str, backend: str) -> str:
    names = ", ".join(f"{n} (v{v.number})" for n, v in sorted(host.current.items()))
    return f"agentrt serve: {names} on {url} (backend {backend}; started {time.strftime('%X')})"
