"""TITO under Anthropic Messages, OpenAI Responses and Gemini (fake vLLM), streamed and not.

Each family's tool loop (question → tool call → tool result → answer) runs on a proxy with TITO
on and on one with it off. With it on, the second call is a token prompt whose ids equal the chat
path's exactly, and the agent's answers keep the family's shape: the same events and blocks, the
same text and tool calls (only random ids differ).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from family_support import calculator_parameters, parse_sse
from proxy_support import Harness, proxy_settings, start_harness

pytestmark = pytest.mark.anyio

QUESTION = "What is 17 + 25?"
HEADERS = {"anthropic-version": "2023-06-01"}
VOLATILE = {"id", "call_id", "created_at", "responseId", "created", "tool_use_id", "tool_call_id",
            "item_id"}  # fmt: skip
"""Keys with random values (ids, times) on both paths; compared by type only."""


def stable(value: Any) -> Any:
    """`value` with random ids and times blanked (their presence and type kept)."""
    if isinstance(value, dict):
        return {
            k: type(v).__name__ if k in VOLATILE and not isinstance(v, dict) else stable(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [stable(v) for v in value]
    if isinstance(value, str) and ("toolu_" in value or "chatcmpl-tool-" in value):
        return "<id>"
    return value


async def _post(h: Harness, path: str, body: dict[str, Any]) -> Any:
    response = await h.client.post(path, json=body, headers={**h.auth, **HEADERS})
    assert response.status_code == 200, response.text
    if body.get("stream") or "stream" in path:
        return parse_sse(response.content)
    return response.json()


async def anthropic_loop(h: Harness, stream: bool) -> list[Any]:
    tools = [{"name": "calculator", "description": "calc", "input_schema": calculator_parameters()}]
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 256,
        "tools": tools,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    first = await _post(h, "/v1/messages", body)  # the loop's own turns are not streamed
    tool_use = first["content"][-1]
    body["messages"] += [
        {"role": "assistant", "content": first["content"]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_use["id"], "content": "42"}],
        },
    ]
    second = await _post(h, "/v1/messages", {**body, "stream": stream})
    return [first, second]


async def responses_loop(h: Harness, stream: bool) -> list[Any]:
    tool = {"type": "function", "name": "calculator", "parameters": calculator_parameters()}
    question = {"type": "message", "role": "user", "content": QUESTION}
    body = {"model": "p", "input": [question], "tools": [tool], "store": False}
    first = await _post(h, "/v1/responses", body)
    call = first["output"][-1]
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "42"}
    body = {**body, "input": [question, call, output], "stream": stream}
    return [first, await _post(h, "/v1/responses", body)]


async def gemini_loop(h: Harness, stream: bool) -> list[Any]:
    declaration = {"name": "calculator", "parameters": calculator_parameters()}
    tools = [{"functionDeclarations": [declaration]}]
    contents: list[Any] = [{"role": "user", "parts": [{"text": QUESTION}]}]
    first = await _post(
        h, "/v1beta/models/p:generateContent", {"contents": contents, "tools": tools}
    )
    model_turn = first["candidates"][0]["content"]
    call = model_turn["parts"][0]["functionCall"]
    response = {"name": "calculator", "id": call.get("id"), "response": {"result": 42}}
    contents += [model_turn, {"role": "user", "parts": [{"functionResponse": response}]}]
    action = "streamGenerateContent?alt=sse" if stream else "generateContent"
    second = await _post(h, f"/v1beta/models/p:{action}", {"contents": contents, "tools": tools})
    return [first, second]


LOOPS: dict[str, Callable[[Harness, bool], Awaitable[list[Any]]]] = {
    "anthropic_messages": anthropic_loop,
    "responses": responses_loop,
    "gemini": gemini_loop,
}


async def _run(tito: str, name: str, stream: bool) -> tuple[list[Any], list[dict[str, Any]]]:
    async for h in start_harness(proxy_settings(proxy_tito=tito)):
        answers = await LOOPS[name](h, stream)
        return answers, await h.rows()
    raise AssertionError("no harness")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("name", list(LOOPS))
async def test_a_family_tool_loop_goes_token_in_and_answers_the_same(
    name: str, stream: bool
) -> None:
    on_answers, on_rows = await _run("on", name, stream)
    off_answers, off_rows = await _run("off", name, stream)
    assert [(r["api_type"], r["prompt_source"]) for r in on_rows] == [
        (name, "chat"),
        (name, "tito"),
    ]
    assert [r["prompt_source"] for r in off_rows] == ["chat", "chat"]
    first, second = on_rows
    assert second["prompt_ids"] == off_rows[1]["prompt_ids"]  # the chat path's exact ids
    assert second["completion_ids"] == off_rows[1]["completion_ids"]
    context = first["prompt_ids"] + first["completion_ids"]
    assert second["prompt_ids"][: len(context)] == context
    assert stable(second["engine_request"]) == stable(off_rows[1]["engine_request"])  # chat form
    assert stable(on_answers) == stable(off_answers)
    text = json.dumps(on_answers[1])
    assert "token_ids" not in text and (stream or "ANSWER: " in text)
