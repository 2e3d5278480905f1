"""Runs one task with the OpenAI Agents SDK (`openai-agents`), unmodified, through the proxy.

Started by the `openai_agents` preset with the harness install's own Python, by file path: it
imports only the SDK (and the `openai` client it depends on) and the standard library.

    python openai_agents_driver.py --max-turns N --api responses|chat --config CONFIG.json

The task comes from POLAR_INSTRUCTION, the endpoint and key from OPENAI_BASE_URL/OPENAI_API_KEY,
the model from POLAR_MODEL, the workspace from POLAR_WORKDIR. The agent gets three function
tools on the workspace (a shell command with a timeout, read a file, write a file) plus the MCP
servers named in the config. `--api responses` uses the SDK's default model class (POST
/v1/responses), `--api chat` its chat-completions model. Tracing export is off (it would call the
vendor's own endpoint). The final output is written to the config's `answer_file`, the run's items
(the conversation as the SDK replays it) to its `transcript_file`. Exit status: 0 when the agent
gave a final output, 2 when it ran out of turns, 1 on any other failure (transcript still written).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import traceback
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    AgentsException,
    MaxTurnsExceeded,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.mcp import MCPServerStdio, MCPServerStreamableHttp
from openai import AsyncOpenAI

OUTPUT_LIMIT = 20_000
"""Characters of a tool's output the model sees (the rest is cut, with a note)."""

WORKDIR = Path(os.environ.get("POLAR_WORKDIR") or os.getcwd())
SHELL_TIMEOUT_S = 120.0


def _clip(text: str) -> str:
    if len(text) <= OUTPUT_LIMIT:
        return text
    return text[:OUTPUT_LIMIT] + f"\n[... {len(text) - OUTPUT_LIMIT} more characters cut]"


def _path(path: str) -> Path:
    return (WORKDIR / path).resolve() if not os.path.isabs(path) else Path(path)


@function_tool  # type: ignore[untyped-decorator]
def run_shell(command: str) -> str:
    """Run a shell command in the workspace and return its exit code, stdout and stderr.

    Args:
        command: The command line, run with /bin/sh in the workspace directory.
    """
    try:
        proc = subprocess.run(
            command,
            shell=True,
            cwd=WORKDIR,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=SHELL_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"command timed out after {SHELL_TIMEOUT_S:g}s"
    return _clip(f"exit code {proc.returncode}\n{proc.stdout}{proc.stderr}")


@function_tool  # type: ignore[untyped-decorator]
def read_file(path: str) -> str:
    """Read a text file.

    Args:
        path: The file's path, relative to the workspace or absolute.
    """
    try:
        return _clip(_path(path).read_text(errors="replace"))
    except OSError as exc:
        return f"error: {exc}"


@function_tool  # type: ignore[untyped-decorator]
def write_file(path: str, content: str) -> str:
    """Write a text file (created with its parent directories, or overwritten).

    Args:
        path: The file's path, relative to the workspace or absolute.
        content: The whole new text of the file.
    """
    target = _path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    except OSError as exc:
        return f"error: {exc}"
    return f"wrote {len(content)} characters to {path}"


def _mcp_servers(config: dict[str, Any]) -> list[Any]:
    servers: list[Any] = []
    for name, server in (config.get("mcp_servers") or {}).items():
        if server.get("url"):
            servers.append(MCPServerStreamableHttp({"url": server["url"]}, name=name))
        else:
            params = {"command": server["command"], "args": server.get("args") or []}
            if server.get("env"):
                params["env"] = {**os.environ, **server["env"]}
            servers.append(MCPServerStdio(params, name=name))
    return servers


def _model(api: str, model: str) -> Any:
    client = AsyncOpenAI(
        base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"]
    )
    if api == "chat":
        return OpenAIChatCompletionsModel(model=model, openai_client=client)
    return OpenAIResponsesModel(model=model, openai_client=client)


async def _run(args: argparse.Namespace, config: dict[str, Any], instruction: str) -> Any:
    async with AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(s) for s in _mcp_servers(config)]
        agent = Agent(
            name="polar",
            instructions=config.get("instructions") or None,
            model=_model(args.api, os.environ["POLAR_MODEL"]),
            tools=[run_shell, read_file, write_file],
            mcp_servers=servers,
        )
        return await Runner.run(agent, instruction, max_turns=args.max_turns)


def _write_transcript(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    global SHELL_TIMEOUT_S
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-turns", type=int, required=True)
    parser.add_argument("--api", choices=("responses", "chat"), default="responses")
    parser.add_argument("--config", required=True, help="JSON: answer/transcript files, MCP")
    args = parser.parse_args(argv)
    config = json.loads(Path(args.config).read_text())
    SHELL_TIMEOUT_S = float(config.get("shell_timeout_s") or SHELL_TIMEOUT_S)
    set_tracing_disabled(True)
    instruction = os.environ["POLAR_INSTRUCTION"]
    record: dict[str, Any] = {
        "harness": "openai-agents",
        "api": args.api,
        "model": os.environ.get("POLAR_MODEL"),
        "max_turns": args.max_turns,
    }
    transcript = _path(config["transcript_file"])
    try:
        result = asyncio.run(_run(args, config, instruction))
    except AgentsException as exc:
        data = exc.run_data
        items = [item.to_input_item() for item in data.new_items] if data is not None else []
        user = [{"role": "user", "content": instruction}]
        _write_transcript(transcript, {**record, "items": user + items, "error": repr(exc)})
        print(f"openai-agents stopped: {exc!r}", file=sys.stderr)
        return 2 if isinstance(exc, MaxTurnsExceeded) else 1
    except Exception as exc:  # the client's errors (HTTP, connection) end the run the same way
        user = [{"role": "user", "content": instruction}]
        _write_transcript(transcript, {**record, "items": user, "error": repr(exc)})
        traceback.print_exc()
        return 1
    answer = "" if result.final_output is None else str(result.final_output)
    _write_transcript(
        transcript,
        {**record, "items": result.to_input_list(), "final_output": answer, "error": None},
    )
    answer_file = _path(config["answer_file"])
    answer_file.parent.mkdir(parents=True, exist_ok=True)
    answer_file.write_text(answer)
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
