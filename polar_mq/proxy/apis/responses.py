"""OpenAI Responses (`POST /v1/responses`, Codex and the OpenAI SDK) over the engine's chat.

The request becomes the engine's chat request so the captured token ids are the engine's own:
`instructions` a leading system message, `message` items chat messages (`developer` as `system`),
`function_call` items the assistant's `tool_calls` (merged with the assistant text before them),
`function_call_output` items `tool` messages, `reasoning` items the next assistant message's
`reasoning` field, function tools chat function tools, and `custom` (freeform) tools functions
with one string argument whose calls come back as `custom_tool_call` items (`responses_custom`).
The translation is deterministic, so a history re-sent unchanged (Codex sends `store: false` and
the whole history every turn) renders to the same prompt tokens and `prefix_merge` chains the
turns.

`previous_response_id` is served from the proxy's own `ResponseStore` (the engine keeps no
state): the stored conversation is put in front of the new input. The engine's answer comes back
as a `response` object (`responses_render`) or as the Responses event stream
(`responses_stream`). Errors use OpenAI's shape (`{"error": {"message", "type", "param",
"code"}}`).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import orjson
from starlette.responses import Response

from polar_mq.proxy.apis import responses_custom as custom
from polar_mq.proxy.apis.base import (
    AUTHENTICATION,
    INVALID_REQUEST,
    NOT_FOUND,
    PERMISSION,
    RATE_LIMITED,
    TOO_LARGE,
    FamilyError,
    FamilyRequest,
    Translation,
)
from polar_mq.proxy.apis.responses_render import TURN, Turn, new_id, render
from polar_mq.proxy.apis.responses_stream import stream
from polar_mq.proxy.apis.route import Handler, family_endpoint

NAME = "responses"
PREVIOUS_NOT_FOUND = "previous_response_not_found"
"""A kind of our own: OpenAI answers an unknown `previous_response_id` with this error code."""
ERROR_TYPES = {
    INVALID_REQUEST: "invalid_request_error",
    PREVIOUS_NOT_FOUND: "invalid_request_error",
    AUTHENTICATION: "authentication_error",
    PERMISSION: "permission_error",
    NOT_FOUND: "invalid_request_error",
    TOO_LARGE: "invalid_request_error",
    RATE_LIMITED: "rate_limit_error",
}
ERROR_CODES = {PREVIOUS_NOT_FOUND: PREVIOUS_NOT_FOUND, RATE_LIMITED: "rate_limit_exceeded"}
ERROR_PARAMS = {PREVIOUS_NOT_FOUND: "previous_response_id"}
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text")
TOOL_CHOICES = ("auto", "none", "required")
UNSUPPORTED_FIELDS = ("conversation", "prompt")
"""Server-side state the engine cannot provide; refused rather than silently dropped."""

__all__ = ["NAME", "error_response", "render", "routes", "stream", "to_chat"]


def error_response(status: int, kind: str, message: str) -> Response:
    """OpenAI's error body; anything 5xx-like (unavailable, upstream) is a `server_error`."""
    kind_type = ERROR_TYPES.get(kind, "invalid_request_error") if status < 500 else "server_error"
    error = {
        "message": message,
        "type": kind_type,
        "param": ERROR_PARAMS.get(kind),
        "code": ERROR_CODES.get(kind),
    }
    return Response(orjson.dumps({"error": error}), status, media_type="application/json")


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise FamilyError(message)


def _text_part(part: dict[str, Any], where: str) -> str:
    key = "refusal" if part.get("type") == "refusal" else "text"
    _need(isinstance(part.get(key), str), f"{where}.{key}: expected a string")
    text: str = part[key]
    return text


def _image_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    url = part.get("image_url")
    _need(
        isinstance(url, str) and bool(url),
        f"{where}: only `input_image` parts with an `image_url` are supported (no `file_id`)",
    )
    image: dict[str, Any] = {"url": url}
    if isinstance(part.get("detail"), str):
        image["detail"] = part["detail"]
    return {"type": "image_url", "image_url": image}


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    """Chat content parts (`text`, `image_url`) of a Responses content list."""
    _need(isinstance(content, list), f"{where}: expected a string or a list of content parts")
    out = []
    for i, part in enumerate(content):
        at = f"{where}[{i}]"
        _need(isinstance(part, dict), f"{at}: expected a content part object")
        kind = part.get("type")
        if kind in (*TEXT_PARTS, "refusal"):
            out.append({"type": "text", "text": _text_part(part, at)})
        elif kind == "input_image":
            out.append(_image_part(part, at))
        else:
            raise FamilyError(f"{at}: unsupported content part type {kind!r}")
    return out


def _content(content: Any, role: str, where: str) -> Any:
    """A chat message content: a string when it is text only (as a chat agent would send it)."""
    if isinstance(content, str):
        return content
    parts = _parts(content, where)
    texts = [p["text"] for p in parts if p["type"] == "text"]
    if role == "assistant":
        _need(len(texts) == len(parts), f"{where}: an assistant message can only hold text")
        return "".join(texts)
    if len(texts) == len(parts) and len(parts) == 1:
        return texts[0]
    return parts


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """A reasoning item's text: its `reasoning_text` content, else its summary."""
    content = item.get("content")
    if isinstance(content, list) and content:
        return "".join(_text_part(p, f"{where}.content") for p in content if isinstance(p, dict))
    summary = item.get("summary")
    _need(summary is None or isinstance(summary, list), f"{where}.summary: expected a list")
    return "\n\n".join(_text_part(p, f"{where}.summary") for p in summary or ())


class _Conversation:
    """Chat messages built item by item (tool calls merge into the assistant turn before them)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._reasoning: str | None = None

    def _assistant(self, message: dict[str, Any]) -> None:
        if self._reasoning is not None:
            message["reasoning"] = self._reasoning
            self._reasoning = None
        self.messages.append(message)

    def message(self, item: dict[str, Any], where: str) -> None:
        role = ROLES.get(str(item.get("role")))
        if role is None:
            raise FamilyError(f"{where}.role: expected user, assistant, system or developer")
        content = _content(item.get("content"), role, f"{where}.content")
        if role == "assistant":
            self._assistant({"role": "assistant", "content": content})
        else:
            self._reasoning = None
            self.messages.append({"role": role, "content": content})

    def function_call(self, item: dict[str, Any], where: str) -> None:
        is_custom = item.get("type") == custom.CALL_ITEM
        value = "input" if is_custom else "arguments"
        for key in ("call_id", "name", value):
            _need(isinstance(item.get(key), str), f"{where}.{key}: expected a string")
        arguments = custom.arguments_of(item["input"]) if is_custom else item["arguments"]
        call = {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": arguments},
        }
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant" and self._reasoning is None:
            last.setdefault("tool_calls", []).append(call)
        else:
            self._assistant({"role": "assistant", "content": None, "tool_calls": [call]})

    def function_call_output(self, item: dict[str, Any], where: str) -> None:
        _need(isinstance(item.get("call_id"), str), f"{where}.call_id: expected a string")
        output = item.get("output")
        if not isinstance(output, str):
            parts = _parts(output, f"{where}.output")
            texts = [p["text"] for p in parts if p["type"] == "text"]
            output = "".join(texts) if len(texts) == len(parts) else parts
        self._reasoning = None
        self.messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})

    def reasoning(self, item: dict[str, Any], where: str) -> None:
        text = _reasoning_text(item, where)
        self._reasoning = text if self._reasoning is None else self._reasoning + text

    def add(self, item: Any, where: str) -> None:
        _need(isinstance(item, dict), f"{where}: expected an input item object")
        kind = item.get("type")
        if kind == "message" or (kind is None and "role" in item):
            self.message(item, where)
        elif kind in ("function_call", custom.CALL_ITEM):
            self.function_call(item, where)
        elif kind in ("function_call_output", custom.OUTPUT_ITEM):
            self.function_call_output(item, where)
        elif kind == "reasoning":
            self.reasoning(item, where)
        else:
            raise FamilyError(f"{where}.type: unsupported item type {kind!r}")


def _input_items(value: Any) -> list[Any]:
    """The request's `input` as items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    _need(value is None or isinstance(value, list), "input: expected a string or a list of items")
    return list(value or ())


def _tools(value: Any) -> list[dict[str, Any]]:
    _need(isinstance(value, list), "tools: expected a list")
    out = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        _need(isinstance(tool, dict), f"{where}: expected a tool object")
        kind = tool.get("type")
        if kind == custom.CUSTOM:
            out.append(custom.chat_tool(tool, where))
            continue
        _need(
            kind == "function",
            f"{where}.type: unsupported tool type {kind!r} (only function and custom)",
        )
        _need(isinstance(tool.get("name"), str), f"{where}.name: expected a string")
        function = {"name": tool["name"]}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: Any) -> Any:
    if value in TOOL_CHOICES:
        return value
    if isinstance(value, dict) and value.get("type") in ("function", custom.CUSTOM):
        _need(isinstance(value.get("name"), str), "tool_choice.name: expected a string")
        return {"type": "function", "function": {"name": value["name"]}}
    raise FamilyError(
        "tool_choice: expected auto, none, required or a function or custom tool choice"
    )


def _response_format(text: Any) -> dict[str, Any] | None:
    _need(isinstance(text, dict), "text: expected an object")
    fmt = text.get("format")
    if fmt is None:
        return None
    _need(isinstance(fmt, dict), "text.format: expected an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    _need(kind == "json_schema", f"text.format.type: unsupported format {kind!r}")
    _need(isinstance(fmt.get("name"), str), "text.format.name: expected a string")
    _need(isinstance(fmt.get("schema"), dict), "text.format.schema: expected an object")
    schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


def _number(body: dict[str, Any], key: str, integer: bool = False) -> Any:
    value = body.get(key)
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    _need(
        value is None or (isinstance(value, kinds) and not isinstance(value, bool)),
        f"{key}: expected {'an integer' if integer else 'a number'}",
    )
    return value


def _history(body: dict[str, Any], request: FamilyRequest) -> list[Any]:
    """The stored conversation `previous_response_id` names (empty without one)."""
    previous = body.get("previous_response_id")
    if previous is None:
        return []
    _need(isinstance(previous, str), "previous_response_id: expected a string")
    store = request.responses
    items = store.get(previous, request.rollout_id) if store is not None else None
    if items is None:
        raise FamilyError(
            f"Previous response with id '{previous}' not found.", kind=PREVIOUS_NOT_FOUND
        )
    return list(items)


def _chat_options(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """Tools and sampling options, in chat-completions terms."""
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("parallel_tool_calls") is not None:
        _need(isinstance(body["parallel_tool_calls"], bool), "parallel_tool_calls: expected a bool")
        chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    max_tokens = _number(body, "max_output_tokens", integer=True)
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    for key in ("temperature", "top_p"):
        if _number(body, key) is not None:
            chat[key] = body[key]
    if body.get("text") is not None:
        response_format = _response_format(body["text"])
        if response_format is not None:
            chat["response_format"] = response_format


def _echo(body: dict[str, Any]) -> dict[str, Any]:
    """The request fields a `response` object repeats back (OpenAI's defaults when absent)."""
    return {
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "store": body.get("store", True) is not False,
        "temperature": body.get("temperature"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation") or "disabled",
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


def to_chat(body: dict[str, Any], request: FamilyRequest) -> Translation:
    """The engine's chat request for a Responses request; `FamilyError` on bad input."""
    model = body.get("model")
    _need(isinstance(model, str) and bool(model), "model: expected a string")
    for key in UNSUPPORTED_FIELDS:
        _need(body.get(key) is None, f"{key}: not supported by this server")
    _need(not body.get("background"), "background: background responses are not supported")
    instructions = body.get("instructions")
    _need(instructions is None or isinstance(instructions, str), "instructions: expected a string")
    history = _history(body, request)
    items = _input_items(body.get("input"))
    conversation = _Conversation()
    for i, item in enumerate(history):
        conversation.add(item, f"previous_response_id[{i}]")
    for i, item in enumerate(items):
        conversation.add(item, f"input[{i}]")
    _need(bool(conversation.messages), "input: expected at least one message")
    messages = conversation.messages
    if instructions:
        messages = [{"role": "system", "content": instructions}, *messages]
    chat: dict[str, Any] = {"model": model, "messages": messages}
    _chat_options(body, chat)
    streaming = body.get("stream") is True
    if streaming:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    turn = Turn(
        response_id=new_id("resp_"),
        created_at=int(time.time()),
        model=str(model),
        echo=_echo(body),
        history=[*history, *items],
        store=body.get("store", True) is not False,
        rollout_id=request.rollout_id,
        responses=request.responses,
        custom_tools=custom.names(body.get("tools")),
    )
    return Translation(chat=chat, stream=streaming, agent_model=model, context={TURN: turn})


def routes() -> list[tuple[str, Handler, str]]:
    return [("/v1/responses", family_endpoint(sys.modules[__name__]), "POST")]
