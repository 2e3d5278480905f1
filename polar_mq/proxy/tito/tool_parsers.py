"""Tool calls out of generated text, for the model's own markup (a registry by parser name).

Under TITO the engine answers a completions request, so the proxy parses tool calls itself, the
way vLLM's tool parser of the same name would: `hermes` (Hermes, Qwen 2.5/3, SmolLM2's tool
format) reads `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks; the text before
the first block is the content. Text that fails to parse stays content (never a 500).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Parsed:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ToolParser:
    name: str
    start: str
    """The marker opening a tool call: a stream holds text back from there on."""
    parse: Callable[[str], Parsed]


def tool_call_id() -> str:
    return "chatcmpl-tool-" + secrets.token_hex(16)


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
HERMES_START = "<tool_call>"


def parse_hermes(text: str) -> Parsed:
    at = text.find(HERMES_START)
    if at < 0:
        return Parsed(text)
    calls: list[dict[str, Any]] = []
    for match in _HERMES.finditer(text, at):
        try:
            doc = json.loads(match.group(1))
        except ValueError:
            return Parsed(text)
        if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
            return Parsed(text)
        arguments = doc.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        function = {"name": doc["name"], "arguments": arguments}
        calls.append({"id": tool_call_id(), "type": "function", "function": function})
    if not calls:
        return Parsed(text)
    content = text[:at]
    return Parsed(content if content.strip() else None, calls)


PARSERS: dict[str, ToolParser] = {
    "hermes": ToolParser("hermes", HERMES_START, parse_hermes),
}


def get_parser(name: str) -> ToolParser:
    """The parser called `name`; `ValueError` naming the known ones otherwise (boot check)."""
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(
            f"tito tool parser {name!r} is not known (known: {', '.join(sorted(PARSERS))})"
        ) from None
