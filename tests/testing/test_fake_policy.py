"""The scripted calculator policy behind the fake engine."""

from __future__ import annotations

import json
from typing import Any

import pytest

from polar_mq.testing.fake_policy import chat_reply, find_expression

TOOLS = [{"type": "function", "function": {"name": "calculator"}}]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What is 17 + 25?", "17 + 25"),
        ("Compute (3+4)*5.", "(3+4)*5"),
        ("x = -3 * (2 + 1)) ok", "-3 * (2 + 1)"),
        ("what is 3.5/7 -", "3.5/7"),
        ("In 2024 there were 12 months", None),
        ("no numbers at all", None),
    ],
)
def test_find_expression(text: str, expected: str | None) -> None:
    assert find_expression(text) == expected


def test_text_protocol() -> None:
    question = {"role": "user", "content": "What is 2 * 21?"}
    assert chat_reply([question], None).text == "CALC: 2 * 21"
    follow_up = [
        question,
        {"role": "assistant", "content": "CALC: 2 * 21"},
        {"role": "user", "content": "RESULT: 42"},
    ]
    assert chat_reply(follow_up, None).text == "ANSWER: 42"
    assert chat_reply([{"role": "user", "content": "Hello"}], None).text == "ANSWER: unknown"


def test_native_tool_calls() -> None:
    reply = chat_reply([{"role": "user", "content": "What is 2 * 21?"}], TOOLS)
    assert reply.tool_call is not None and reply.tool_call.name == "calculator"
    assert json.loads(reply.tool_call.arguments) == {"expression": "2 * 21"}
    assert reply.text.startswith("<tool_call>\n") and reply.text.endswith("\n</tool_call>")
    after_tool: list[dict[str, Any]] = [
        {"role": "user", "content": "What is 2 * 21?"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "tool_call_id": "x", "content": " 42 "},
    ]
    assert chat_reply(after_tool, TOOLS).text == "ANSWER: 42"
    assert chat_reply([{"role": "user", "content": "Hi"}], TOOLS).text == "ANSWER: unknown"
