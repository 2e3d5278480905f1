"""A minimal MCP server over stdio for the preset tests: one tool, `add(a, b)`.

Newline-delimited JSON-RPC, as MCP's stdio transport is: answers `initialize`, `tools/list` and
`tools/call`; notifications get no answer.
"""

from __future__ import annotations

import json
import sys
from typing import Any

ADD = {
    "name": "add",
    "description": "Add two integers",
    "inputSchema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


def answer(method: str, params: dict[str, Any]) -> dict[str, Any]:
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "calc", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": [ADD]}
    if method == "tools/call":
        arguments = params.get("arguments") or {}
        total = arguments["a"] + arguments["b"]  # not bare JSON: Gemini CLI parses that
        return {"content": [{"type": "text", "text": f"The sum is {total}."}]}
    return {}


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("id") is None:
            continue
        result = answer(str(message.get("method")), message.get("params") or {})
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}))
        sys.stdout.write("\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
