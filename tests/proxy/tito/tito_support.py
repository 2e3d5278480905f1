"""A multi-turn agent for the TITO tests: keeps its history exactly as the OpenAI SDK would."""

from __future__ import annotations

from typing import Any

import orjson
from proxy_support import Harness

from polar_mq.testing.fake_tokenizer import encode, render_chat
from polar_mq.trajectories.base import CapturedCall

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
QUESTIONS = ("What is (3+4)*5?", "And what is 12*12?", "Finally, 7-9?")


def assemble(raw: bytes) -> dict[str, Any]:
    """A streamed chat answer as one message (content and tool calls), as the SDK builds it."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for event in raw.split(b"\n\n"):
        if not event.startswith(b"data: ") or event == b"data: [DONE]":
            continue
        chunk = orjson.loads(event[6:])
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or ():
                slot = calls.setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["name"] += function.get("name") or ""
                slot["arguments"] += function.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for _, c in sorted(calls.items())
        ]
    return {"message": message, "finish_reason": finish}


async def ask(h: Harness, body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message and finish reason the agent gets for `body`."""
    response = await h.post("/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    if body.get("stream"):
        return assemble(response.content)
    choice = response.json()["choices"][0]
    message = {k: v for k, v in choice["message"].items()}
    message.update(refusal=None, annotations=[], audio=None, function_call=None)  # SDK dump
    return {"message": message, "finish_reason": choice["finish_reason"]}


def tool_result(message: dict[str, Any]) -> dict[str, Any]:
    call = message["tool_calls"][0]
    expression = orjson.loads(call["function"]["arguments"])["expression"]
    value = eval(expression.replace("^", "**"), {"__builtins__": {}})  # the test's own tool
    return {"role": "tool", "tool_call_id": call["id"], "content": str(value)}


async def run_agent(
    h: Harness, *, stream: bool = False, tools: bool = True, questions: tuple[str, ...] = QUESTIONS
) -> list[dict[str, Any]]:
    """A calculator agent: each question, a tool call (or CALC/RESULT), then the answer.

    Returns every request's messages with the answer it got (to replay them on the chat path)."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You compute."}]
    turns: list[dict[str, Any]] = []
    for question in questions:
        history.append({"role": "user", "content": question})
        for _ in range(4):
            body: dict[str, Any] = {"model": "agent", "messages": list(history), "stream": stream}
            if tools:
                body["tools"] = [CALCULATOR]
            got = await ask(h, body)
            turns.append({"body": body, **got})
            message = got["message"]
            history.append(message)
            text = message.get("content") or ""
            if message.get("tool_calls"):
                history.append(tool_result(message))
            elif "CALC:" in text:
                expression = text.split("CALC:", 1)[1].strip()
                value = eval(expression, {"__builtins__": {}})
                history.append({"role": "user", "content": f"RESULT: {value}"})
            else:
                break
    return turns


def chat_prompt(body: dict[str, Any], thinking: bool = False) -> list[int]:
    """The ids the fake's chat path gives `body`'s messages (its byte tokenizer is exact)."""
    return encode(render_chat(body["messages"], body.get("tools"), strip_thinking=thinking))


def captured(rows: list[dict[str, Any]]) -> list[CapturedCall]:
    """Stored rows as the build stage reads them."""
    return [
        CapturedCall(
            seq=row["seq"],
            call_id=str(row["id"]),
            prompt_ids=row["prompt_ids"],
            completion_ids=row["completion_ids"],
            logprobs=row["logprobs"],
            finish_reason=row["finish_reason"],
            policy_version=row["policy_version"],
            status_code=row["status_code"],
            request=row["request"],
            response=row["response"],
            prompt_source=row["prompt_source"],
            tito_fallback=row["tito_fallback"],
        )
        for row in rows
    ]
