"""Custom (freeform) tools of the Responses API carried over the engine's chat tool calls.

A Responses `custom` tool takes one free-form string (Codex's `apply_patch` is one, with a Lark
grammar), which chat tools cannot express. The engine sees it as a function with a single string
argument `input` (the tool's format, if any, is stated in that argument's description), and the
model's call comes back as a `custom_tool_call` item whose `input` is that string. The mapping is
deterministic both ways, so a history re-sent with `custom_tool_call` items renders to the same
prompt tokens the engine saw.
"""

from __future__ import annotations

import json
from typing import Any

from polar_mq.proxy.apis.base import FamilyError

CUSTOM = "custom"
CALL_ITEM = "custom_tool_call"
OUTPUT_ITEM = "custom_tool_call_output"
ARGUMENT = "input"


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise FamilyError(message)


def _format_note(fmt: Any, where: str) -> str:
    """What the argument's description says about the tool's input format."""
    if fmt is None:
        return ""
    _need(isinstance(fmt, dict), f"{where}.format: expected an object")
    kind = fmt.get("type")
    if kind == "text":
        return ""
    _need(kind == "grammar", f"{where}.format.type: expected text or grammar")
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    _need(isinstance(syntax, str), f"{where}.format.syntax: expected a string")
    _need(isinstance(definition, str), f"{where}.format.definition: expected a string")
    return f" It must match this {syntax} grammar:\n{definition}"


def chat_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """The chat function tool standing in for a Responses `custom` tool."""
    _need(isinstance(tool.get("name"), str), f"{where}.name: expected a string")
    description = tool.get("description")
    _need(description is None or isinstance(description, str), f"{where}.description: string")
    argument = {
        "type": "string",
        "description": "The tool's free-form input." + _format_note(tool.get("format"), where),
    }
    function: dict[str, Any] = {"name": tool["name"]}
    if description:
        function["description"] = description
    function["parameters"] = {
        "type": "object",
        "properties": {ARGUMENT: argument},
        "required": [ARGUMENT],
        "additionalProperties": False,
    }
    return {"type": "function", "function": function}


def arguments_of(tool_input: str) -> str:
    """The chat tool call's `arguments` for a custom tool call's `input`."""
    return json.dumps({ARGUMENT: tool_input}, ensure_ascii=False)


def input_of(arguments: str) -> str:
    """A custom tool call's `input` from the model's arguments: the one string argument it gave
    (whatever the model named it), else the arguments text as written."""
    try:
        decoded = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(decoded, dict):
        if isinstance(decoded.get(ARGUMENT), str):
            return str(decoded[ARGUMENT])
        strings = [v for v in decoded.values() if isinstance(v, str)]
        if len(decoded) == 1 and strings:
            return strings[0]
    return arguments


def names(tools: Any) -> frozenset[str]:
    """The names of the request's custom tools (their calls come back as `custom_tool_call`)."""
    if not isinstance(tools, list):
        return frozenset()
    return frozenset(
        str(t["name"])
        for t in tools
        if isinstance(t, dict) and t.get("type") == CUSTOM and isinstance(t.get("name"), str)
    )


def call_item(
    item_id: str, call_id: str, name: str, tool_input: str, status: str
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": CALL_ITEM,
        "status": status,
        "call_id": call_id,
        "name": name,
        "input": tool_input,
    }
