"""Runs one smolagents agent on one task, through the proxy (the `smolagents` preset's driver).

Run with the preset's own venv python, by path; imports only smolagents and the standard library.
The task comes from POLAR_INSTRUCTION, the endpoint from OPENAI_BASE_URL / OPENAI_API_KEY and the
model from POLAR_MODEL. The final answer (what the agent passed to `final_answer`, or its last
answer when it ran out of steps) is written to --answer; the agent's memory (every step: model
input and output, tool calls, observations, errors) to --transcript as JSON.

Exit status: 0 when the agent ended (with an answer, or out of steps: smolagents then asks the
model for a last answer; the transcript's `state` says which), 2 when the run itself failed (the
model endpoint kept failing...; the transcript is still written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from smolagents import CodeAgent, OpenAIServerModel, PythonInterpreterTool, ToolCallingAgent

TOOLS = {"python_interpreter": PythonInterpreterTool}
"""smolagents' default tools that need no network (final_answer is always there)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agent", choices=("tool_calling", "code"), default="tool_calling")
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--tool-choice", choices=("required", "auto"), default="required")
    parser.add_argument("--tool", action="append", default=[], choices=sorted(TOOLS))
    parser.add_argument("--authorized-import", action="append", default=[])
    parser.add_argument("--instructions", default=None, help="added to the system prompt")
    parser.add_argument("--answer", required=True, type=Path)
    parser.add_argument("--transcript", required=True, type=Path)
    return parser.parse_args(argv)


def build_agent(args: argparse.Namespace) -> ToolCallingAgent | CodeAgent:
    model = OpenAIServerModel(
        model_id=os.environ["POLAR_MODEL"],
        api_base=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        # the model's kwargs override smolagents' own `tool_choice: required`
        **({} if args.tool_choice == "required" else {"tool_choice": args.tool_choice}),
    )
    tools = [TOOLS[name]() for name in dict.fromkeys(args.tool)]
    common: dict[str, Any] = {
        "tools": tools,
        "model": model,
        "max_steps": args.max_steps,
        "instructions": args.instructions,
        "return_full_result": True,
    }
    if args.agent == "code":
        return CodeAgent(additional_authorized_imports=args.authorized_import, **common)
    return ToolCallingAgent(**common)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    agent = build_agent(args)
    try:
        result = agent.run(os.environ["POLAR_INSTRUCTION"])
    except Exception as exc:  # the agent failed: keep what it did, say why
        traceback.print_exc()
        steps = agent.memory.get_full_steps()
        write_json(args.transcript, {"state": "error", "error": repr(exc), "steps": steps})
        return 2
    write_json(args.transcript, result.dict())
    if result.output is not None:
        args.answer.parent.mkdir(parents=True, exist_ok=True)
        args.answer.write_text(str(result.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
