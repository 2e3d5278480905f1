"""The Responses `response` object built from the engine's chat answer, and what is remembered.

Shared by the non-streaming answer (`render`) and the event stream (`responses_stream`), so both
produce the same object: output items in the order the model produced them (reasoning, then the
message text, then one `function_call`, or `custom_tool_call` for a custom tool, per tool call),
usage in Responses terms, and the request fields OpenAI echoes. No token id or logprob of the
engine's ever reaches the agent here; they are captured and stored before the answer is rendered.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from polar_mq.proxy.apis import responses_custom as custom
from polar_mq.proxy.apis.base import FINISH_LENGTH, Translation, reasoning_of

TURN = "turn"
"""The key of the `Turn` in `Translation.context`."""
COMPLETED = "completed"
INCOMPLETE = "incomplete"
IN_PROGRESS = "in_progress"
FAILED = "failed"


def new_id(prefix: str) -> str:
    """An OpenAI-style id (`resp_…`, `msg_…`, `fc_…`, `rs_…`): random, so never reused."""
    return prefix + uuid.uuid4().hex


@dataclass(slots=True)
class Turn:
    """One Responses call: its ids, the fields it echoes, and the conversation to remember."""

    response_id: str
    created_at: int
    model: str
    """The agent's model name (the engine's served name never shows)."""
    echo: dict[str, Any]
    history: list[Any]
    """The conversation as Responses items: the stored history plus this request's input."""
    store: bool
    rollout_id: uuid.UUID
    responses: Any
    """The proxy's `ResponseStore` (None when there is none)."""
    custom_tools: frozenset[str] = frozenset()
    """Names of the request's custom tools: their calls are `custom_tool_call` items."""

    def remember(self, output: list[dict[str, Any]]) -> None:
        """Keep the whole conversation under this response's id for `previous_response_id`."""
        if self.store and self.responses is not None:
            self.responses.put(self.response_id, self.rollout_id, [*self.history, *output])


def turn_of(translation: Translation) -> Turn:
    turn: Turn = translation.context[TURN]
    return turn


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant message item; `text` None while streaming, before its part was added."""
    content = [] if text is None else [text_part(text)]
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
    }


def usage_of(usage: Any) -> dict[str, Any] | None:
    """The engine's chat usage in Responses terms (None when the engine gave none).

    `cache_write_tokens` is required by the current OpenAI SDK types; the engine reports none.
    """
    if not isinstance(usage, dict):
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": int(cached or 0), "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }


def status_of(finish_reason: Any) -> str:
    return INCOMPLETE if finish_reason == FINISH_LENGTH else COMPLETED


def response_object(
    turn: Turn,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `response` object (the same id and creation time in every event of a stream)."""
    incomplete = {"reason": "max_output_tokens"} if status == INCOMPLETE else None
    return {
        "id": turn.response_id,
        "object": "response",
        "created_at": turn.created_at,
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        "model": turn.model,
        "output": output,
        "usage": usage,
        **turn.echo,
    }


def tool_call_item(
    turn: Turn, item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    """A `function_call` item, or a `custom_tool_call` item when `name` is a custom tool."""
    if name in turn.custom_tools:
        return custom.call_item(item_id, call_id, name, custom.input_of(arguments), status)
    return function_call_item(item_id, call_id, name, arguments, status)


def _tool_call_items(turn: Turn, message: dict[str, Any]) -> list[dict[str, Any]]:
    items = []
    for call in message.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        prefix = "ctc_" if name in turn.custom_tools else "fc_"
        items.append(
            tool_call_item(
                turn,
                new_id(prefix),
                str(call.get("id") or new_id("call_")),
                name,
                str(function.get("arguments") or ""),
                COMPLETED,
            )
        )
    return items


def render(data: dict[str, Any], translation: Translation) -> dict[str, Any]:
    """The non-streaming `response` for the engine's chat answer `data` (choice 0)."""
    turn = turn_of(translation)
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    message = choice.get("message") or {}
    status = status_of(choice.get("finish_reason"))
    output: list[dict[str, Any]] = []
    reasoning = reasoning_of(message)
    if reasoning:
        output.append(reasoning_item(new_id("rs_"), reasoning, COMPLETED))
    text = message.get("content")
    if isinstance(text, str) and text:
        output.append(message_item(new_id("msg_"), text, COMPLETED))
    output += _tool_call_items(turn, message)
    if output and status == INCOMPLETE:
        output[-1]["status"] = INCOMPLETE  # only the item being generated was cut off
    turn.remember(output)
    return response_object(turn, status, output, usage_of(data.get("usage")))
