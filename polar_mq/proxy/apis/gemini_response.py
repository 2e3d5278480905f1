"""The engine's chat answer as a Gemini `GenerateContentResponse`, whole or chunk by chunk.

Both shapes come from the same pieces (`candidate`, `usage_metadata`, `function_call_part`), so a
streamed answer reassembled by a client equals the non-streamed one. Token ids and logprobs never
appear: the agent sees what the real API would send, the ids stay in the stored call.

Streams are relayed as they arrive: each text (or reasoning) delta becomes one chunk at once.
Function calls go out whole, with the finish reason, once the engine finished (real vLLM may
split a call's arguments over many chunks; Gemini clients expect complete `args` objects). The
last chunk carries `finishReason` and `usageMetadata`, as Gemini's last chunk does. With
`?alt=sse` chunks are server-sent events; without it the stream is one JSON array written
progressively (`[{...},\\r\\n{...}]`), which is what the REST API sends to clients that did not
ask for SSE. An engine error, or a stream that breaks off, ends the stream with an error object
in Google's shape, which Google's SDKs raise.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import orjson

from polar_mq.proxy.apis.base import (
    AUTHENTICATION,
    FINISH_LENGTH,
    INVALID_REQUEST,
    NOT_FOUND,
    RATE_LIMITED,
    TOO_LARGE,
    UNAVAILABLE,
    UPSTREAM,
    Translation,
    reasoning_of,
    sse_event,
)
from polar_mq.proxy.engines.base import choice0

FINISH_REASONS = {
    FINISH_LENGTH: "MAX_TOKENS",
    "stop": "STOP",
    "tool_calls": "STOP",
    "function_call": "STOP",
    "content_filter": "SAFETY",
}
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
ROLE = "model"
SSE = "text/event-stream"
JSON = "application/json"


KIND_NAMES = {
    INVALID_REQUEST: "INVALID_ARGUMENT",
    AUTHENTICATION: "UNAUTHENTICATED",
    NOT_FOUND: "NOT_FOUND",
    TOO_LARGE: "INVALID_ARGUMENT",
    RATE_LIMITED: "RESOURCE_EXHAUSTED",
    UNAVAILABLE: "UNAVAILABLE",
    UPSTREAM: "INTERNAL",
}
"""The shared path's error kinds, for statuses Google has no canonical name for."""


def status_name(status: int, kind: str | None = None) -> str:
    """Google's canonical status name (what its SDKs expose as `status`) for an HTTP status."""
    name = STATUS_NAMES.get(status) or KIND_NAMES.get(kind or "")
    return name or ("INVALID_ARGUMENT" if status < 500 else "INTERNAL")


def error_document(status: int, message: str, kind: str | None = None) -> dict[str, Any]:
    """Google's error body: `{"error": {"code", "message", "status"}}`."""
    return {"error": {"code": status, "message": message, "status": status_name(status, kind)}}


def finish_reason(reason: Any) -> str:
    """The engine's finish reason as Gemini's `finishReason` (a call is a normal STOP)."""
    return FINISH_REASONS.get(reason, "OTHER") if isinstance(reason, str) else "OTHER"


def function_call_part(call: dict[str, Any], index: int) -> dict[str, Any]:
    """A chat tool call (`{id, function: {name, arguments}}` or the flat stream form) as a
    `functionCall` part; `args` is the parsed object (a non-object is wrapped as `{"value"}`)."""
    function = call.get("function") or call
    raw = function.get("arguments") or "{}"
    try:
        args: Any = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        args = {"value": raw}
    if not isinstance(args, dict):
        args = {"value": args}
    name = function.get("name") or ""
    call_id = call.get("id") or f"call_{index}"
    return {"functionCall": {"name": name, "args": args, "id": call_id}}


def usage_metadata(prompt: int, completion: int) -> dict[str, int]:
    """Gemini's token counts; the engine's are the exact ids captured for the call."""
    return {
        "promptTokenCount": prompt,
        "candidatesTokenCount": completion,
        "totalTokenCount": prompt + completion,
    }


def _usage_of(data: dict[str, Any]) -> dict[str, int]:
    usage = data.get("usage") or {}
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    if not isinstance(prompt, int):
        prompt = len(data.get("prompt_token_ids") or ())
    if not isinstance(completion, int):
        choice = choice0(data) or {}
        completion = len(choice.get("token_ids") or ())
    return usage_metadata(prompt, completion)


def candidate(parts: list[dict[str, Any]], finish: str | None = None) -> dict[str, Any]:
    """Candidate 0 (the only one: `candidateCount` > 1 is refused) with its content."""
    out: dict[str, Any] = {"content": {"role": ROLE, "parts": parts}}
    if finish is not None:
        out["finishReason"] = finish
    out["index"] = 0
    return out


def response_id(data: dict[str, Any]) -> str:
    """The engine's request id (so an answer can be found in the stored call), else a fresh one."""
    value = data.get("id")
    return value if isinstance(value, str) and value else uuid.uuid4().hex


def render(data: dict[str, Any], translation: Translation) -> dict[str, Any]:
    """The non-streaming `GenerateContentResponse` of the engine's chat response."""
    choice = choice0(data) or {}
    message = choice.get("message") or {}
    parts: list[dict[str, Any]] = []
    reasoning = reasoning_of(message)
    if reasoning:
        parts.append({"text": reasoning, "thought": True})
    if isinstance(message.get("content"), str) and message["content"]:
        parts.append({"text": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or ()):
        if isinstance(call, dict):
            parts.append(function_call_part(call, index))
    if not parts:
        parts.append({"text": ""})
    return {
        "candidates": [candidate(parts, finish_reason(choice.get("finish_reason")))],
        "usageMetadata": _usage_of(data),
        "modelVersion": translation.agent_model,
        "responseId": response_id(data),
    }


class GeminiStream:
    """A `StreamTranslator`: engine chat chunks in, Gemini chunks out (SSE or a JSON array)."""

    def __init__(self, translation: Translation, sse: bool) -> None:
        self.media_type = SSE if sse else JSON
        self._sse = sse
        self._model = translation.agent_model
        self._id: str | None = None
        self._sent = 0
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish: str | None = None
        self._usage: dict[str, int] | None = None
        self._prompt_ids = 0
        self._completion_ids = 0
        self._closed = False
        """True once the last chunk (or an error) went out: anything later is dropped."""
        self._ended = False
        """True once the stream's end (`done` or `fail`) was written."""

    def _frame(self, document: dict[str, Any]) -> bytes:
        payload = orjson.dumps(document)
        self._sent += 1
        if self._sse:
            return sse_event(None, payload)
        return (b"[" if self._sent == 1 else b",\r\n") + payload

    def _chunk(self, parts: list[dict[str, Any]], finish: str | None = None) -> bytes:
        document: dict[str, Any] = {"candidates": [candidate(parts, finish)]}
        if finish is not None:
            document["usageMetadata"] = self._usage or usage_metadata(
                self._prompt_ids, self._completion_ids
            )
        document["modelVersion"] = self._model
        document["responseId"] = self._id or uuid.uuid4().hex
        return self._frame(document)

    def chunk(self, data: dict[str, Any]) -> bytes:
        if self._closed:
            return b""
        if self._id is None:
            self._id = response_id(data)
        if "error" in data:
            return self._error(data["error"])
        prompt_ids = data.get("prompt_token_ids")
        if isinstance(prompt_ids, list) and not self._prompt_ids:
            self._prompt_ids = len(prompt_ids)
        if data.get("usage"):
            self._usage = _usage_of(data)
        choice = choice0(data)
        if choice is None:
            return self._last() if self._usage is not None and self._finish else b""
        self._completion_ids += len(choice.get("token_ids") or ())
        delta = choice.get("delta") or {}
        out = b""
        reasoning = reasoning_of(delta)
        if reasoning:
            out += self._chunk([{"text": reasoning, "thought": True}])
        if isinstance(delta.get("content"), str) and delta["content"]:
            out += self._chunk([{"text": delta["content"]}])
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                self._merge(call)
        if choice.get("finish_reason") is not None:
            self._finish = finish_reason(choice["finish_reason"])
            if self._usage is not None:
                out += self._last()
        return out

    def _merge(self, delta: dict[str, Any]) -> None:
        """Accumulate a tool call split over chunks (id and name once, arguments in pieces)."""
        call = self._calls.setdefault(
            delta.get("index", 0), {"id": None, "name": "", "arguments": ""}
        )
        call["id"] = delta.get("id") or call["id"]
        function = delta.get("function") or {}
        call["name"] += function.get("name") or ""
        call["arguments"] += function.get("arguments") or ""

    def _last(self) -> bytes:
        """The closing chunk: complete function calls, the finish reason, the usage."""
        parts = [function_call_part(self._calls[i], i) for i in sorted(self._calls)]
        self._closed = True
        return self._chunk(parts or [{"text": ""}], self._finish or "STOP")

    def _error(self, error: Any) -> bytes:
        if isinstance(error, dict):
            code = error.get("code")
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
            message = str(error.get("message") or "the inference server reported an error")
        else:
            status, message = 500, str(error)
        self._closed = True
        return self._frame(error_document(status, message))

    def done(self) -> bytes:
        out = b""
        if self._ended:
            return out
        if not self._closed:
            if self._finish is None:
                out = self._error({"code": 502, "message": "the engine ended without finishing"})
            else:
                out = self._last()
        return out + self._end()

    def fail(self, message: str) -> bytes:
        if self._ended:
            return b""
        out = b"" if self._closed else self._error({"code": 502, "message": message})
        return out + self._end()

    def _end(self) -> bytes:
        if self._sse or self._ended:
            return b""
        self._ended = True
        return b"]" if self._sent else b"[]"
