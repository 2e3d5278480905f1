"""The Responses event stream, built from the engine's chat chunks as they arrive.

Each engine chunk is turned into Responses events at once (nothing is buffered beyond the item
being generated), in OpenAI's order: `response.created` and `response.in_progress` first; one
output item at a time (`response.output_item.added` … its deltas … `response.output_item.done`):
a reasoning item for the engine's reasoning deltas, a message item (with one `output_text`
content part) for text, one `function_call` item per tool call, whose arguments may come in many
chunks (a call of a custom tool is a `custom_tool_call` item: its input is the decoded string
argument, so it is sent whole when the call ends); finally `response.completed` (or
`response.incomplete` when the engine stopped at the token limit) with the whole `response`. An
engine error chunk or a broken upstream ends the stream with `response.failed`. Every event
carries its `type` and an increasing `sequence_number`; no `[DONE]` is sent (the Responses API
has none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from polar_mq.proxy.apis import responses_custom as custom
from polar_mq.proxy.apis.base import Translation, reasoning_of, sse_event
from polar_mq.proxy.apis.responses_render import (
    COMPLETED,
    FAILED,
    IN_PROGRESS,
    INCOMPLETE,
    Turn,
    function_call_item,
    message_item,
    new_id,
    reasoning_item,
    response_object,
    status_of,
    text_part,
    turn_of,
    usage_of,
)

REASONING, MESSAGE, FUNCTION_CALL = "reasoning", "message", "function_call"
CUSTOM_CALL = custom.CALL_ITEM


@dataclass(slots=True)
class _Item:
    """The output item being generated (only one is open at a time)."""

    kind: str
    item_id: str
    index: int
    text: str = ""
    """Reasoning or message text, or a function call's arguments so far."""
    call_id: str = ""
    name: str = ""
    tool_index: int | None = None
    pending: list[str] = field(default_factory=list)
    """Argument pieces that came before the call's name (the item is announced with its name)."""
    announced: bool = False

    def snapshot(self, status: str, done: bool = False) -> dict[str, Any]:
        if self.kind == REASONING:
            item = reasoning_item(self.item_id, self.text, status)
            if not done:
                item["content"] = []
            return item
        if self.kind == MESSAGE:
            return message_item(self.item_id, self.text if done else None, status)
        if self.kind == CUSTOM_CALL:
            tool_input = custom.input_of(self.text) if done else ""
            return custom.call_item(self.item_id, self.call_id, self.name, tool_input, status)
        return function_call_item(
            self.item_id, self.call_id, self.name, self.text if done else "", status
        )


class ResponsesStream:
    """A `StreamTranslator` for one Responses stream."""

    media_type = "text/event-stream"

    def __init__(self, turn: Turn) -> None:
        self._turn = turn
        self._seq = 0
        self._started = False
        self._finished = False
        self._open: _Item | None = None
        self._output: list[dict[str, Any]] = []
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self._tool_ids: set[int] = set()

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, **fields, "sequence_number": self._seq}
        self._seq += 1
        return sse_event(kind, orjson.dumps(payload))

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        response = response_object(self._turn, IN_PROGRESS, [])
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def _open_item(self, item: _Item) -> bytes:
        self._open = item
        item.announced = True
        out = self._event(
            "response.output_item.added",
            output_index=item.index,
            item=item.snapshot(IN_PROGRESS),
        )
        if item.kind == REASONING:
            part = {"type": "reasoning_text", "text": ""}
        elif item.kind == MESSAGE:
            part = text_part("")
        else:
            return out
        common = {"item_id": item.item_id, "output_index": item.index, "content_index": 0}
        return out + self._event("response.content_part.added", **common, part=part)

    def _close(self, status: str = COMPLETED) -> bytes:
        item = self._open
        if item is None:
            return b""
        out = b""
        if not item.announced:  # a tool call whose name never came: announce it now
            out += self._open_item(item)
            out += self._arguments(item, "".join(item.pending))
        self._open = None
        common = {"item_id": item.item_id, "output_index": item.index}
        if item.kind == REASONING:
            part = {"type": "reasoning_text", "text": item.text}
            out += self._event(
                "response.reasoning_text.done", **common, content_index=0, text=item.text
            )
            out += self._event("response.content_part.done", **common, content_index=0, part=part)
        elif item.kind == MESSAGE:
            out += self._event(
                "response.output_text.done", **common, content_index=0, text=item.text, logprobs=[]
            )
            part = text_part(item.text)
            out += self._event("response.content_part.done", **common, content_index=0, part=part)
        elif item.kind == CUSTOM_CALL:
            tool_input = custom.input_of(item.text)
            if tool_input:
                out += self._event(
                    "response.custom_tool_call_input.delta", **common, delta=tool_input
                )
            out += self._event("response.custom_tool_call_input.done", **common, input=tool_input)
        else:
            out += self._event(
                "response.function_call_arguments.done", **common, arguments=item.text
            )
        done = item.snapshot(status, done=True)
        self._output.append(done)
        return out + self._event("response.output_item.done", output_index=item.index, item=done)

    def _next_index(self) -> int:
        return len(self._output)

    def _text(self, kind: str, delta: str) -> bytes:
        """A reasoning or message delta: the item of that kind opens first if it is not open."""
        out = b""
        if self._open is None or self._open.kind != kind:
            out += self._close()
            prefix = "rs_" if kind == REASONING else "msg_"
            out += self._open_item(_Item(kind, new_id(prefix), self._next_index()))
        item = self._open
        assert item is not None
        item.text += delta
        common = {"item_id": item.item_id, "output_index": item.index, "content_index": 0}
        if kind == REASONING:
            return out + self._event("response.reasoning_text.delta", **common, delta=delta)
        return out + self._event("response.output_text.delta", **common, delta=delta, logprobs=[])

    def _arguments(self, item: _Item, delta: str) -> bytes:
        if not delta:
            return b""
        item.text += delta
        if item.kind == CUSTOM_CALL:
            return b""  # JSON-encoded pieces of the input: sent decoded, whole, at the end
        return self._event(
            "response.function_call_arguments.delta",
            item_id=item.item_id,
            output_index=item.index,
            delta=delta,
        )

    def _tool_call(self, delta: dict[str, Any]) -> bytes:
        """One tool-call delta: a new index opens a new `function_call` item (closing the last)."""
        index = delta.get("index", 0)
        function = delta.get("function") or {}
        out = b""
        item = self._open
        if (
            item is None
            or item.kind not in (FUNCTION_CALL, CUSTOM_CALL)
            or item.tool_index != index
        ):
            if index in self._tool_ids:
                return b""  # a late piece of a call already closed: nothing valid to send
            self._tool_ids.add(index)
            out += self._close()
            call_id = str(delta.get("id") or new_id("call_"))
            item = _Item(
                FUNCTION_CALL, new_id("fc_"), self._next_index(), call_id=call_id, tool_index=index
            )
            self._open = item
        item.name += function.get("name") or ""
        arguments = function.get("arguments") or ""
        if not item.announced:
            if not item.name:
                item.pending.append(arguments)
                return out
            if item.name in self._turn.custom_tools:
                item.kind, item.item_id = CUSTOM_CALL, new_id("ctc_")
            out += self._open_item(item)
            arguments = "".join(item.pending) + arguments
            item.pending.clear()
        return out + self._arguments(item, arguments)

    def chunk(self, data: dict[str, Any]) -> bytes:
        if self._finished:
            return b""
        out = self._start()
        if "error" in data:
            return out + self._failed(_error_message(data["error"]))
        if data.get("usage"):
            self._usage = data["usage"]
        choices = data.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            return out
        delta = choice.get("delta") or {}
        reasoning = reasoning_of(delta)
        if reasoning:
            out += self._text(REASONING, reasoning)
        content = delta.get("content")
        if isinstance(content, str) and content:
            out += self._text(MESSAGE, content)
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                out += self._tool_call(call)
        if choice.get("finish_reason") is not None:
            self._finish_reason = choice["finish_reason"]
        return out

    def done(self) -> bytes:
        if self._finished:
            return b""
        out = self._start()
        status = status_of(self._finish_reason)
        out += self._close(status)
        self._finished = True
        response = response_object(self._turn, status, self._output, usage_of(self._usage))
        self._turn.remember(self._output)
        kind = "response.incomplete" if status == INCOMPLETE else "response.completed"
        return out + self._event(kind, response=response)

    def _failed(self, message: str) -> bytes:
        self._finished = True
        if self._open is not None and self._open.announced:
            self._output.append(self._open.snapshot(INCOMPLETE, done=True))
        self._open = None
        error = {"code": "server_error", "message": message}
        response = response_object(self._turn, FAILED, self._output, usage_of(self._usage), error)
        return self._event("response.failed", response=response)

    def fail(self, message: str) -> bytes:
        if self._finished:
            return b""
        return self._start() + self._failed(message)


def _error_message(error: Any) -> str:
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return str(error) if error else "the inference server reported an error"


def stream(translation: Translation) -> ResponsesStream:
    """The translator for one streamed Responses call."""
    return ResponsesStream(turn_of(translation))
