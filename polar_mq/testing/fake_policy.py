"""The fake engine's "model": a scripted policy that drives the reference calculator agent.

It is deterministic so end-to-end tests can assert exact answers, and it exercises both ways an
agent uses tools: text protocols (`CALC:` / `RESULT:` / `ANSWER:`) and native `tool_calls`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from polar_mq.testing.fake_tokenizer import content_text, tool_call_markup

_EXPR_CHARS = re.compile(r"[0-9.()+\-*/%^ \t]+")
_HAS_OPERATION = re.compile(r"\d\s*\)*\s*[-+*/%^]\s*\(*\s*-?\s*\d")
_LEAD_JUNK = re.compile(r"^[\s+*/%^.]+|^-(?![\d(])")
_TRAIL_JUNK = re.compile(r"[\s+\-*/%^.]+$")


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Reply:
    """What the policy "generates": the text it samples, and the tool call that text encodes."""

    text: str
    tool_call: ToolCall | None = None


def find_expression(text: str) -> str | None:
    """The longest arithmetic expression in `text` (`What is (3+4)*5?` -> `(3+4)*5`), if any."""
    best: str | None = None
    for match in _EXPR_CHARS.finditer(text):
        candidate = _tidy(match.group())
        if _HAS_OPERATION.search(candidate) and (best is None or len(candidate) > len(best)):
            best = candidate
    return best


def _tidy(raw: str) -> str:
    """Drop unmatched parentheses and dangling operators/punctuation around an expression."""
    unmatched: set[int] = set()
    open_at: list[int] = []
    for i, char in enumerate(raw):
        if char == "(":
            open_at.append(i)
        elif char == ")":
            if open_at:
                open_at.pop()
            else:
                unmatched.add(i)
    unmatched.update(open_at)
    expr = "".join(c for i, c in enumerate(raw) if i not in unmatched)
    previous = None
    while previous != expr:
        previous = expr
        expr = _TRAIL_JUNK.sub("", _LEAD_JUNK.sub("", expr))
    return expr


def _last(messages: Sequence[Mapping[str, Any]], role: str) -> Mapping[str, Any] | None:
    for message in reversed(messages):
        if message.get("role") == role:
            return message
    return None


def chat_reply(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> Reply:
    """The scripted turn of the calculator agent's conversation (see the module docstring)."""
    last = messages[-1] if messages else {}
    last_text = content_text(last.get("content")).strip()
    if last.get("role") == "user" and last_text.startswith("RESULT:"):
        return Reply("ANSWER: " + last_text.removeprefix("RESULT:").strip())
    if tools and last.get("role") == "tool":
        return Reply("ANSWER: " + last_text)
    user = _last(messages, "user")
    expression = find_expression(content_text(user.get("content"))) if user else None
    if expression is None:
        return Reply("ANSWER: unknown")
    if tools:
        arguments = json.dumps({"expression": expression})
        return Reply(tool_call_markup("calculator", arguments), ToolCall("calculator", arguments))
    return Reply("CALC: " + expression)


def completion_text(prompt_text: str) -> str:
    """Echo-ish continuation for `/v1/completions`: repeats the prompt's last line."""
    lines = [line for line in prompt_text.splitlines() if line.strip()]
    tail = lines[-1].strip() if lines else ""
    return " echo: " + tail[-48:]
