"""Small HTTP helpers of ``agentrt serve``: a request's JSON body within a size limit, and an
exception in one line."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request

from agentrt.serving.protocol import RequestError


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


async def read_json(request: Request, limit: int) -> Any:
    """The request's JSON body, refused (413) past ``limit`` bytes before more is read; parsed
    off the event loop."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return await asyncio.to_thread(json.loads, raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON ({exc})") from None


def too_large(limit: int) -> RequestError:
    return RequestError(f"the request body is larger than {limit} bytes, the most this server "
                        "takes (agentrt serve --max-request-mb)", 413)
