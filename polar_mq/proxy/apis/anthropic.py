"""Anthropic Messages (`POST /v1/messages`, Claude Code and the Anthropic SDK) over chat.

The request becomes the engine's chat request: the system prompt a leading system message, a
`system` turn inside `messages` a system message in place, `tool_use` blocks the assistant's
`tool_calls`, `tool_result` blocks `tool` messages (placed before the rest of that user turn, as
chat templates expect), `thinking` blocks the assistant's `reasoning` field, `tools`/`tool_choice`
chat function tools, `stop_sequences` `stop`. The translation is deterministic, so a history
re-sent unchanged renders to the same prompt tokens and `prefix_merge` chains the turns. The
engine's chat answer comes back as a `message` (non-streamed, `render`) or as Anthropic's event
sequence (`anthropic_stream.MessagesStream`).

`/v1/messages/count_tokens` translates the same way and asks the engine's `/tokenize` (no call is
logged: nothing is generated). Errors use Anthropic's shape
(`{"type": "error", "error": {"type", "message"}}`).
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from polar_mq.proxy.apis.anthropic_stream import MessagesStream, stop_reason, usage_of
from polar_mq.proxy.apis.base import (
    AUTHENTICATION,
    INVALID_REQUEST,
    NOT_FOUND,
    PERMISSION,
    RATE_LIMITED,
    TOO_LARGE,
    UNAVAILABLE,
    FamilyError,
    FamilyRequest,
    Translation,
    reasoning_of,
)
from polar_mq.proxy.apis.route import Handler, count_prompt_tokens, family_endpoint, reshape_error
from polar_mq.proxy.rollout_states import Refusal
from polar_mq.proxy.server.body import read_json_object
from polar_mq.proxy.server.gate import admit, kind_of
from polar_mq.proxy.server.state import ProxyState

NAME = "anthropic_messages"
ERROR_TYPES = {
    INVALID_REQUEST: "invalid_request_error",
    AUTHENTICATION: "authentication_error",
    PERMISSION: "permission_error",
    NOT_FOUND: "not_found_error",
    TOO_LARGE: "request_too_large",
    RATE_LIMITED: "rate_limit_error",
    UNAVAILABLE: "overloaded_error",
}
CUSTOM_TOOL_TYPES = (None, "custom")
"""Client tools (the only kind an engine can serve); server tools (web search, ...) are refused."""


def error_response(status: int, kind: str, message: str) -> Response:
    body = {
        "type": "error",
        "error": {"type": ERROR_TYPES.get(kind, "api_error"), "message": message},
    }
    return Response(orjson.dumps(body), status, media_type="application/json")


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise FamilyError(message)


def _text_of(blocks: Any, where: str) -> str:
    """The text of a `system` or `tool_result` content: a string or a list of text blocks."""
    if isinstance(blocks, str):
        return blocks
    _need(isinstance(blocks, list), f"{where}: expected a string or a list of content blocks")
    texts = []
    for i, block in enumerate(blocks):
        _need(isinstance(block, dict), f"{where}.{i}: expected a content block object")
        _need(block.get("type") == "text", f"{where}.{i}: expected a text block")
        _need(isinstance(block.get("text"), str), f"{where}.{i}.text: expected a string")
        texts.append(block["text"])
    return "\n".join(texts)


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise FamilyError(f"{where}.source: expected an object")
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        _need(isinstance(media, str) and isinstance(data, str), f"{where}.source: media_type, data")
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        _need(isinstance(source.get("url"), str), f"{where}.source.url: expected a string")
        url = source["url"]
    else:
        raise FamilyError(f"{where}.source.type: unsupported image source {kind!r}")
    return {"type": "image_url", "image_url": {"url": url}}


def _user_turn(content: Any, where: str) -> list[dict[str, Any]]:
    """A user message as chat messages: its tool results first (one `tool` message each)."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    _need(isinstance(content, list), f"{where}.content: expected a string or a list of blocks")
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        _need(isinstance(block, dict), f"{at}: expected a content block object")
        kind = block.get("type")
        if kind == "text":
            _need(isinstance(block.get("text"), str), f"{at}.text: expected a string")
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append(_image_part(block, at))
        elif kind == "tool_result":
            tools.extend(_tool_result(block, at))
        else:
            raise FamilyError(f"{at}.type: unsupported content block type {kind!r} in a user turn")
    out = [m for m in tools if m["role"] == "tool"]
    parts = [*(p for m in tools if m["role"] == "user" for p in m["content"]), *parts]
    if parts:
        out.append({"role": "user", "content": _compact(parts)})
    return out


def _compact(parts: list[dict[str, Any]]) -> Any:
    """Text-only content as one string (what every chat template renders alike)."""
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _tool_result(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    tool_use_id = block.get("tool_use_id")
    _need(isinstance(tool_use_id, str), f"{where}.tool_use_id: expected a string")
    content = block.get("content", "")
    images: list[dict[str, Any]] = []
    if isinstance(content, list):  # images cannot ride in a chat tool message: a user turn after
        images = [
            _image_part(b, f"{where}.content.{i}")
            for i, b in enumerate(content)
            if isinstance(b, dict) and b.get("type") == "image"
        ]
        content = [b for b in content if not (isinstance(b, dict) and b.get("type") == "image")]
    text = _text_of(content, f"{where}.content")
    out = [{"role": "tool", "tool_call_id": tool_use_id, "content": text}]
    if images:
        out.append({"role": "user", "content": images})
    return out


def _assistant_turn(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    _need(isinstance(content, list), f"{where}.content: expected a string or a list of blocks")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        _need(isinstance(block, dict), f"{at}: expected a content block object")
        kind = block.get("type")
        if kind == "text":
            _need(isinstance(block.get("text"), str), f"{at}.text: expected a string")
            texts.append(block["text"])
        elif kind == "tool_use":
            _need(isinstance(block.get("id"), str), f"{at}.id: expected a string")
            _need(isinstance(block.get("name"), str), f"{at}.name: expected a string")
            arguments = orjson.dumps(block.get("input") or {}).decode()
            function = {"name": block["name"], "arguments": arguments}
            calls.append({"id": block["id"], "type": "function", "function": function})
        elif kind == "thinking":
            _need(isinstance(block.get("thinking"), str), f"{at}.thinking: expected a string")
            reasoning.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # opaque to us and to the engine
        else:
            raise FamilyError(f"{at}.type: unsupported content block type {kind!r} in a reply")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning"] = "\n".join(reasoning)
    return message


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise FamilyError("messages: expected a non-empty list")
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text_of(system, "system")})
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        _need(isinstance(message, dict), f"{where}: expected an object")
        role = message.get("role")
        if role == "user":
            out.extend(_user_turn(message.get("content"), where))
        elif role == "assistant":
            out.append(_assistant_turn(message.get("content"), where))
        elif role == "system":  # a mid-conversation system turn (Claude Code 2.1.3xx sends them)
            text = _text_of(message.get("content"), f"{where}.content")
            out.append({"role": "system", "content": text})
        else:
            raise FamilyError(
                f"{where}.role: expected 'user', 'assistant' or 'system', got {role!r}"
            )
    return out


def _tools(body: dict[str, Any], chat: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None:
        _need(isinstance(tools, list), "tools: expected a list")
        converted = []
        for i, tool in enumerate(tools):
            _need(isinstance(tool, dict), f"tools.{i}: expected an object")
            _need(
                tool.get("type") in CUSTOM_TOOL_TYPES,
                f"tools.{i}.type: server tool {tool.get('type')!r} is not supported by this server",
            )
            _need(isinstance(tool.get("name"), str), f"tools.{i}.name: expected a string")
            schema = tool.get("input_schema")
            _need(isinstance(schema, dict), f"tools.{i}.input_schema: expected an object")
            function = {"name": tool["name"], "parameters": schema}
            if isinstance(tool.get("description"), str):
                function["description"] = tool["description"]
            converted.append({"type": "function", "function": function})
        if converted:
            chat["tools"] = converted
    choice = body.get("tool_choice")
    if choice is None:
        return
    _need(isinstance(choice, dict), "tool_choice: expected an object")
    kind = choice.get("type")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool":
        _need(isinstance(choice.get("name"), str), "tool_choice.name: expected a string")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise FamilyError(f"tool_choice.type: unsupported {kind!r}")
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False


def _sampling(body: dict[str, Any], chat: dict[str, Any]) -> None:
    max_tokens = body.get("max_tokens")
    _need("max_tokens" in body, "max_tokens: Field required")
    _need(
        isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0,
        "max_tokens: expected a positive integer",
    )
    chat["max_tokens"] = max_tokens
    for name in ("temperature", "top_p", "top_k"):
        value = body.get(name)
        if value is not None:
            _need(isinstance(value, int | float) and not isinstance(value, bool), f"{name}: number")
            chat[name] = value
    stops = body.get("stop_sequences")
    if stops is not None:
        _need(
            isinstance(stops, list) and all(isinstance(s, str) for s in stops),
            "stop_sequences: expected a list of strings",
        )
        if stops:
            chat["stop"] = stops


def to_chat(body: dict[str, Any], request: FamilyRequest) -> Translation:
    model = body.get("model")
    _need(isinstance(model, str) and bool(model), "model: Field required")
    chat: dict[str, Any] = {"model": model, "messages": _messages(body)}
    _tools(body, chat)
    _sampling(body, chat)
    stream = body.get("stream") is True
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    stops = chat.get("stop") or []
    return Translation(chat=chat, stream=stream, agent_model=model, context={"stops": stops})


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    try:
        arguments = orjson.loads(function.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        arguments = {}
    return {
        "type": "tool_use",
        "id": call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
        "name": function.get("name") or "",
        "input": arguments if isinstance(arguments, dict) else {},
    }


def render(data: dict[str, Any], translation: Translation) -> dict[str, Any]:
    """The `message` for the engine's non-streamed chat answer (choice 0)."""
    choices = data.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    reasoning = reasoning_of(message)
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    calls = [_tool_use(c) for c in message.get("tool_calls") or () if isinstance(c, dict)]
    content.extend(calls)
    reason, sequence = stop_reason(choice, bool(calls), translation.context.get("stops") or [])
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": translation.agent_model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_of(data.get("usage")),
    }


def stream(translation: Translation) -> MessagesStream:
    return MessagesStream(translation)


async def count_tokens(request: Request) -> Response:
    """`/v1/messages/count_tokens`: the prompt's length by the engine's own tokenizer."""
    state: ProxyState = request.app.state.proxy
    claim = await admit(request)
    if isinstance(claim, Refusal):
        return error_response(claim.status, kind_of(claim), claim.message)
    body = await read_json_object(request, state.max_body_bytes, state.body_read_timeout_s)
    if isinstance(body, Response):
        return reshape_error(body, sys.modules[__name__])
    try:
        model = body.get("model")
        _need(isinstance(model, str) and bool(model), "model: Field required")
        chat: dict[str, Any] = {"messages": _messages(body)}
        _tools(body, chat)
        count = await count_prompt_tokens(state, chat, model)
    except FamilyError as exc:
        return error_response(exc.status, exc.kind, exc.message)
    return Response(orjson.dumps({"input_tokens": count}), 200, media_type="application/json")


def routes() -> list[tuple[str, Handler, str]]:
    module: Any = sys.modules[__name__]
    return [
        ("/v1/messages", family_endpoint(module), "POST"),
        ("/v1/messages/count_tokens", count_tokens, "POST"),
    ]
