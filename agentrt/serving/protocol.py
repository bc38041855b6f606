"""The OpenAI wire format: request checks, prompt encoding, incremental text, response bodies.

Pure functions and small classes over a tokenizer; the HTTP layer (agentrt.serving.api) calls
them. A bad request raises :class:`RequestError`, which becomes a 4xx JSON error in OpenAI's
shape (``{"error": {"message", "type", "param", "code"}}``).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from agentrt.config.rollout import SamplingConfig
from agentrt.policies.chat import chat_of

UNSUPPORTED = ("logprobs", "echo", "best_of", "suffix", "tools", "functions", "logit_bias")


class RequestError(Exception):
    """A request the server cannot answer; ``status`` is the HTTP status (4xx)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind

    def body(self) -> dict[str, Any]:
        return error_body(str(self), self.kind, self.param, self.status)


def error_body(message: str, kind: str, param: str | None, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class Params:
    """A checked completion request."""

    model: str
    prompts: list[list[int]]
    sampling: SamplingConfig
    stream: bool
    stop: list[str]


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError(f"{key} must be a number in [{low}, {high}], not {value!r}", param=key)
    return float(value)


def _max_tokens(body: dict[str, Any], default: int) -> int:
    value = body.get("max_tokens", body.get("max_completion_tokens"))
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(f"max_tokens must be a positive integer, not {value!r}",
                           param="max_tokens")
    return value


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("stop must be a non-empty string or a list of them", param="stop")
    return stops


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a text prompt, starting with bos when the tokenizer has one (as training
    prompts do, agentrt.policies.lm.PromptTemplate)."""
    ids = list(tokenizer.encode(text, add_special_tokens=True))
    bos = tokenizer.bos_token_id
    return [bos] + ids if bos is not None and ids[:1] != [bos] else ids


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Prompt ids of a chat: the tokenizer's chat template with the generation prompt
    (:mod:`agentrt.policies.chat`, as a policy's ``template: auto`` renders its prompts), or,
    for a tokenizer without one (the project's small byte-level models), one line per message
    (``"{role}: {content}\\n"``) then ``"assistant:"``."""
    chat = chat_of(tokenizer)
    if chat is not None:
        return chat.ids(messages)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    return encode_text(tokenizer, text)


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content}",
                           param="messages")
    out = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # content parts: only text ones
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise RequestError(f"messages[{i}]: only text content parts are supported",
                                   param="messages")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or \
                not isinstance(content, str):
            raise RequestError(f"messages[{i}] must be an object with a string role and content",
                               param="messages")
        out.append({"role": m["role"], "content": content})
    return out


def _prompts(body: dict[str, Any], tokenizer: Any, max_prompts: int) -> list[list[int]]:
    prompt = body.get("prompt")
    vocab = len(tokenizer)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str) and (
            len(prompt) > max_prompts):  # before any is tokenized
        raise RequestError(f"{len(prompt)} prompts in one request; this server takes at most "
                           f"{max_prompts} (its queue)", param="prompt")
    if isinstance(prompt, str):
        return [encode_text(tokenizer, prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return [encode_text(tokenizer, p) for p in prompt]
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt):
        return [list(prompt)]
    raise RequestError(f"prompt must be a string, a list of strings or a list of token ids "
                       f"in [0, {vocab})", param="prompt")


def parse(body: Any, chat: bool, tokenizer_of: Any, max_len_of: Any, max_tokens: int,
          max_prompts: int = 4096) -> Params:
    """Checks a completions (``chat`` False) or chat completions body.

    Args:
        tokenizer_of: ``name -> tokenizer``, raising KeyError for an unknown model.
        max_len_of: ``name -> longest prompt + response``.
        max_tokens: Default ``max_tokens``.
        max_prompts: Most prompts one request may hold.
    """
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise RequestError("model is required: the name of a served model (GET /v1/models)",
                           param="model")
    try:
        tokenizer = tokenizer_of(model)
    except KeyError:
        raise RequestError(f"the model {model!r} is not served here (GET /v1/models lists "
                           "them)", status=404, param="model", kind="not_found_error") from None
    for key in UNSUPPORTED:
        if body.get(key) not in (None, False, 0, [], {}):
            raise RequestError(f"{key} is not supported by agentrt serve", param=key)
    if body.get("n", 1) != 1:
        raise RequestError("n must be 1 (send several requests instead)", param="n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream must be true or false", param="stream")
    prompts = ([chat_prompt_ids(tokenizer, _messages(body))] if chat
               else _prompts(body, tokenizer, max_prompts))
    sampling = SamplingConfig(temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                              top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
                              max_new_tokens=_max_tokens(body, max_tokens))
    longest = max(len(p) for p in prompts) + sampling.max_new_tokens
    if longest > max_len_of(model):
        raise RequestError(f"prompt ({longest - sampling.max_new_tokens} tokens) + max_tokens "
                           f"({sampling.max_new_tokens}) exceeds the model's context of "
                           f"{max_len_of(model)} tokens", param="max_tokens")
    if stream and len(prompts) > 1:
        raise RequestError("stream takes one prompt per request", param="prompt")
    return Params(model, prompts, sampling, stream, _stop(body))


class TextStream:
    """Text of a growing response: what is safe to send so far, cut at the first stop string.

    A trailing replacement character (an incomplete UTF-8 byte sequence) and the last
    ``len(stop) - 1`` characters are held back until they cannot change any more.
    """

    def __init__(self, tokenizer: Any, stop: list[str]) -> None:
        self.tokenizer, self.stop = tokenizer, stop
        self.eos = tokenizer.eos_token_id
        self.ids: list[int] = []
        self.sent = 0
        self.stopped = False  # a stop string ended it
        self.hold = max((len(s) - 1 for s in stop), default=0)

    def push(self, token: int) -> str:
        """Adds one generated token; returns the new text that can be sent."""
        if self.stopped or token == self.eos:
            return ""
        self.ids.append(token)
        return self._emit(False)

    def complete(self, ids: list[int]) -> str:
        """The whole text of a finished response's ids (eos and what follows dropped)."""
        self.ids = ids[:ids.index(self.eos)] if self.eos in ids else list(ids)
        return self.finish()

    def finish(self) -> str:
        """The rest of the text once generation ended."""
        return "" if self.stopped else self._emit(True)

    @property
    def text(self) -> str:
        return self._decoded()[0]

    def _decoded(self) -> tuple[str, bool]:
        """(text up to the first stop string, whether one was found)."""
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cuts = [i for i in (full.find(s) for s in self.stop) if i >= 0]
        return (full[:min(cuts)], True) if cuts else (full, False)

    def _emit(self, final: bool) -> str:
        full, stopped = self._decoded()
        if stopped:
            final, self.stopped = True, True
        safe = len(full)
        if not final:
            safe -= max(self.hold, 1 if full.endswith("\ufffd") else 0)
        out = full[self.sent:safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return out


def finish_reason(completion_finished: bool, stream: TextStream) -> str:
    return "stop" if completion_finished or stream.stopped else "length"


def body_of(chat: bool, model: str, fingerprint: str, rid: str, choices: list[dict[str, Any]],
            usage: dict[str, int] | None, chunk: bool = False) -> dict[str, Any]:
    """A (chat) completion response or stream chunk."""
    kind = ("chat.completion" if chat else "text_completion") + (".chunk" if chunk and chat
                                                                 else "")
    out: dict[str, Any] = {"id": rid, "object": kind, "created": int(time.time()),
                           "model": model, "system_fingerprint": fingerprint, "choices": choices}
    if usage is not None:
        out["usage"] = usage
    return out


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def choice(chat: bool, index: int, text: str | None, reason: str | None, delta: bool = False,
           first: bool = False) -> dict[str, Any]:
    """One choice: ``text`` (completions), ``message`` (chat) or ``delta`` (chat stream)."""
    if not chat:
        return {"index": index, "text": text or "", "logprobs": None, "finish_reason": reason}
    if delta:
        d: dict[str, Any] = {"role": "assistant"} if first else {}
        if text:
            d["content"] = text
        return {"index": index, "delta": d, "logprobs": None, "finish_reason": reason}
    return {"index": index, "message": {"role": "assistant", "content": text},
            "logprobs": None, "finish_reason": reason}
