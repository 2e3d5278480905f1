"""Anthropic's streaming event sequence, built from the engine's chat chunks as they arrive.

`message_start` (and a `ping`) on the first chunk; then one content block at a time: a `thinking`
block for the engine's reasoning deltas, a `text` block for content deltas, a `tool_use` block per
tool call (its arguments as `input_json_delta` fragments, as the engine streams them), each
opened with `content_block_start` and closed with `content_block_stop` when the next one begins;
at the engine's `[DONE]`, `message_delta` (stop reason, usage) and `message_stop`. An engine
error, or a stream that breaks off, ends with an `error` event. Nothing is buffered beyond the
current event.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from polar_mq.proxy.apis.base import (
    FINISH_LENGTH,
    FINISH_TOOL_CALLS,
    Translation,
    reasoning_of,
    sse_event,
)

TEXT = "text"
THINKING = "thinking"
TOOL_USE = "tool_use"


def stop_reason(
    choice: dict[str, Any], made_calls: bool, stops: list[str]
) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for a chat choice's finish."""
    finish = choice.get("finish_reason")
    if finish == FINISH_LENGTH:
        return "max_tokens", None
    if made_calls or finish == FINISH_TOOL_CALLS:
        return "tool_use", None
    matched = choice.get("stop_reason")  # vLLM: the stop string (or token id) that ended it
    if isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def usage_of(usage: Any, prompt_ids: Any = None, n_ids: int = 0) -> dict[str, Any]:
    """Anthropic usage from the engine's (or, without one, from the ids seen)."""
    if isinstance(usage, dict):
        input_tokens = usage.get("prompt_tokens") or 0
        output_tokens = usage.get("completion_tokens") or 0
    else:
        input_tokens = len(prompt_ids) if isinstance(prompt_ids, list) else 0
        output_tokens = n_ids
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return sse_event(name, orjson.dumps({"type": name, **payload}))


class MessagesStream:
    """One streamed Messages answer (choice 0 of the engine's chat stream)."""

    media_type = "text/event-stream"

    def __init__(self, translation: Translation) -> None:
        self._translation = translation
        self._id = f"msg_{uuid.uuid4().hex[:24]}"
        self._started = False
        self._index = -1
        self._open: str | None = None
        self._tool_index: int | None = None
        self._made_calls = False
        self._pending_args: dict[int, str] = {}
        self._choice: dict[str, Any] = {}
        self._usage: Any = None
        self._prompt_ids: Any = None
        self._n_ids = 0
        self._finished = False

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._translation.agent_model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_of(None, self._prompt_ids, 0),
        }
        return _event("message_start", {"message": message}) + _event("ping", {})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        self._tool_index = None
        return _event("content_block_stop", {"index": self._index})

    def _open_block(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._index += 1
        self._open = kind
        return out + _event("content_block_start", {"index": self._index, "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"index": self._index, "delta": delta})

    def chunk(self, data: dict[str, Any]) -> bytes:
        if self._prompt_ids is None and isinstance(data.get("prompt_token_ids"), list):
            self._prompt_ids = data["prompt_token_ids"]
        out = self._start()
        if data.get("usage"):
            self._usage = data["usage"]
        if "error" in data:
            error = data["error"]
            message = error.get("message") if isinstance(error, dict) else str(error)
            return out + self.fail(str(message or "the engine reported an error"))
        choices = data.get("choices") or ()
        choice = next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), None)
        if choice is None:
            return out
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self._n_ids += len(ids)
        delta = choice.get("delta") or {}
        reasoning = reasoning_of(delta)
        if reasoning:
            if self._open != THINKING:
                block = {"type": THINKING, "thinking": "", "signature": ""}
                out += self._open_block(THINKING, block)
            out += self._delta({"type": "thinking_delta", "thinking": reasoning})
        text = delta.get("content")
        if text:
            if self._open != TEXT:
                out += self._open_block(TEXT, {"type": TEXT, "text": ""})
            out += self._delta({"type": "text_delta", "text": text})
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                out += self._tool_delta(call)
        if choice.get("finish_reason") is not None:
            self._choice = choice
        return out

    def _tool_delta(self, call: dict[str, Any]) -> bytes:
        index = call.get("index", 0)
        function = call.get("function") or {}
        fragment = function.get("arguments") or ""
        out = b""
        if index != self._tool_index:
            if not function.get("name"):  # arguments before the name: hold them until it comes
                self._pending_args[index] = self._pending_args.get(index, "") + fragment
                return b""
            block = {
                "type": TOOL_USE,
                "id": call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
                "name": function["name"],
                "input": {},
            }
            out += self._open_block(TOOL_USE, block)
            self._tool_index = index
            self._made_calls = True
            fragment = self._pending_args.pop(index, "") + fragment
        if fragment:
            out += self._delta({"type": "input_json_delta", "partial_json": fragment})
        return out

    def done(self) -> bytes:
        if self._finished:
            return b""
        self._finished = True
        out = self._start() + self._close()
        stops = self._translation.context.get("stops") or []
        reason, sequence = stop_reason(self._choice, self._made_calls, stops)
        usage = usage_of(self._usage, self._prompt_ids, self._n_ids)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        out += _event("message_delta", {"delta": delta, "usage": usage})
        return out + _event("message_stop", {})

    def fail(self, message: str) -> bytes:
        if self._finished:
            return b""
        self._finished = True
        error = {"type": "api_error", "message": message}
        return _event("error", {"error": error})
