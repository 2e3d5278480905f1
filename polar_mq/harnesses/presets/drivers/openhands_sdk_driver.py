"""Runs one task with the OpenHands Software Agent SDK (`openhands-sdk` + `openhands-tools`),
unmodified, through the proxy.

Started by the `openhands_sdk` preset with the harness install's own Python (3.12+), by file path:
it imports only the SDK, its tools package and the standard library.

    python openhands_sdk_driver.py --max-iterations N --config CONFIG.json

The task comes from POLAR_INSTRUCTION, the endpoint and key from OPENAI_BASE_URL/OPENAI_API_KEY,
the model from POLAR_MODEL (as litellm's `openai/MODEL`, chat completions), the workspace from
POLAR_WORKDIR. The agent has the SDK's terminal and file-editor tools (plus its built-in finish
and think tools) and the MCP servers of the config; skills written under $HOME/.agents/skills are
loaded as user skills. Every conversation event goes to the config's `transcript_file` (JSON
lines, written as they happen); the final response (the finish tool's message, or the agent's
last plain message) to its `answer_file`. Exit status: 0 when the agent finished, 2 when it hit
the iteration limit or got stuck (the SDK's stuck detector), 1 on any other failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from openhands.sdk import LLM, Agent, AgentContext, Conversation, Event, Tool
from openhands.sdk.conversation.response_utils import get_agent_final_response
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.terminal import TerminalTool
from pydantic import SecretStr

WORKDIR = Path(os.environ.get("POLAR_WORKDIR") or os.getcwd())


def _path(path: str) -> Path:
    return Path(path) if os.path.isabs(path) else WORKDIR / path


def _llm(config: dict[str, Any]) -> LLM:
    return LLM(
        model=f"openai/{os.environ['POLAR_MODEL']}",
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=SecretStr(os.environ["OPENAI_API_KEY"]),
        api_mode="chat",
        usage_id="agent",
        num_retries=int(config.get("num_retries", 2)),
        retry_min_wait=1,
        retry_max_wait=8,
        timeout=int(config.get("llm_timeout_s", 600)),
    )


def _agent(config: dict[str, Any]) -> Agent:
    terminal = {"terminal_type": config.get("terminal_type") or "subprocess"}
    context = None
    if config.get("load_user_skills"):
        context = AgentContext(load_user_skills=True, load_public_skills=False)
    return Agent(
        llm=_llm(config),
        tools=[Tool(name=TerminalTool.name, params=terminal), Tool(name=FileEditorTool.name)],
        mcp_config=config.get("mcp_servers") or {},
        agent_context=context,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--max-iterations", type=int, required=True)
    parser.add_argument("--config", required=True, help="JSON: answer/transcript files, MCP")
    args = parser.parse_args(argv)
    config = json.loads(Path(args.config).read_text())
    transcript = _path(config["transcript_file"])
    transcript.parent.mkdir(parents=True, exist_ok=True)
    events_out = transcript.open("w")
    error_codes: list[str] = []

    def record(event: Event) -> None:
        events_out.write(event.model_dump_json() + "\n")
        events_out.flush()
        code = getattr(event, "code", None)
        if isinstance(code, str):
            error_codes.append(code)

    try:
        conversation = Conversation(
            agent=_agent(config),
            workspace=str(WORKDIR),
            persistence_dir=None,
            callbacks=[record],
            max_iteration_per_run=args.max_iterations,
            visualizer=None,
        )
        conversation.send_message(os.environ["POLAR_INSTRUCTION"])
        conversation.run()
        status = str(conversation.state.execution_status.value)
        answer = get_agent_final_response(conversation.state.events)
        conversation.close()
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        events_out.close()
    answer_file = _path(config["answer_file"])
    answer_file.parent.mkdir(parents=True, exist_ok=True)
    answer_file.write_text(answer)
    print(f"openhands-sdk: {status}")
    print(answer)
    if status == "finished":
        return 0
    print(f"openhands-sdk stopped without finishing: {status} {error_codes}", file=sys.stderr)
    return 2 if status == "stuck" or "MaxIterationsReached" in error_codes else 1


if __name__ == "__main__":
    sys.exit(main())
