"""The built-in reference agent: a small multi-turn tool-calling loop over the OpenAI SDK.

It behaves like any third-party harness would: it only knows the standard environment
(`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `POLAR_*`), talks to whatever OpenAI-compatible server that
points at, and leaves its answer in the work directory. It never rewrites its history, so
consecutive calls extend each other token for token and the trajectory builder can merge them.

Two tool protocols: `text` (default) asks the model for `CALC: <expr>` / `ANSWER: <value>` lines,
which even tiny models manage and which needs no tool parser on the server; `native` uses OpenAI
function calling. Run as `python -m polar_mq.agents.tool_agent`; stdlib, openai and its tools
(`polar_mq.agents.calculator`) only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
from openai.types.chat import ChatCompletionMessage

from polar_mq.agents.calculator import parse_directive, run_calculator

TEXT_SYSTEM_PROMPT = (
    "You are a careful assistant that solves the user's task. "
    "To use the calculator, reply with a line `CALC: <arithmetic expression>` and wait; "
    "you will get `RESULT: <value>`. "
    "When you know the final answer, reply with a line `ANSWER: <value>`."
)
NATIVE_SYSTEM_PROMPT = (
    "You are a careful assistant that solves the user's task. Use the `calculator` tool for "
    "arithmetic and call `submit_answer` with the final answer when you are done."
)
TEXT_NUDGE = "Continue. Write `CALC: <expression>` to calculate or `ANSWER: <value>` to finish."
NATIVE_NUDGE = "Continue. Call `calculator` to calculate or `submit_answer` to finish."
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit_answer",
            "description": "Submit the final answer and finish.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string"}},
                "required": ["answer"],
            },
        },
    },
]

# -- the loop -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything the agent reads from its environment, read once at start."""

    instruction: str
    model: str | None
    workdir: Path
    tools: str
    max_turns: int
    temperature: float
    max_tokens: int
    request_token_ids: bool
    max_retries: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AgentConfig:
        tools = environ.get("POLAR_AGENT_TOOLS", "text").strip().lower() or "text"
        if tools not in ("text", "native"):
            raise ValueError(f"POLAR_AGENT_TOOLS must be 'text' or 'native', got {tools!r}")
        return cls(
            instruction=_instruction(environ),
            model=environ.get("POLAR_MODEL") or None,
            workdir=Path(environ.get("POLAR_WORKDIR") or os.getcwd()),
            tools=tools,
            max_turns=int(environ.get("POLAR_AGENT_MAX_TURNS", "4")),
            temperature=float(environ.get("POLAR_AGENT_TEMPERATURE", "1.0")),
            max_tokens=int(environ.get("POLAR_AGENT_MAX_TOKENS", "128")),
            request_token_ids=environ.get("POLAR_AGENT_REQUEST_TOKEN_IDS", "") == "1",
            max_retries=int(environ.get("POLAR_AGENT_MAX_RETRIES", "2")),
        )


def _instruction(environ: Mapping[str, str]) -> str:
    """POLAR_INSTRUCTION, else the task file's `instruction` (instructions too big for env)."""
    if environ.get("POLAR_INSTRUCTION"):
        return environ["POLAR_INSTRUCTION"]
    task_file = environ.get("POLAR_TASK_FILE")
    if task_file and Path(task_file).is_file():
        task = json.loads(Path(task_file).read_text())
        instruction = task.get("instruction") if isinstance(task, dict) else None
        if isinstance(instruction, str):
            return instruction
    raise ValueError("no task: set POLAR_INSTRUCTION or POLAR_TASK_FILE")


@dataclass(slots=True)
class Outcome:
    """How an episode ended: `answer` is None when the turns ran out first."""

    answer: str | None
    last_content: str
    turns: int


class ToolAgent:
    """One episode: call the model, run the tool it asked for, append, repeat."""

    def __init__(self, client: openai.OpenAI, config: AgentConfig, model: str) -> None:
        self.client = client
        self.config = config
        self.model = model
        self.transcript = config.workdir / "transcript.jsonl"

    def run(self) -> Outcome:
        native = self.config.tools == "native"
        system = NATIVE_SYSTEM_PROMPT if native else TEXT_SYSTEM_PROMPT
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": self.config.instruction},
        ]
        outcome = Outcome(answer=None, last_content="", turns=0)
        self.transcript.write_text("", encoding="utf-8")  # one transcript per episode
        while outcome.turns < self.config.max_turns and outcome.answer is None:
            message = self._call(messages, turn=outcome.turns)
            outcome.turns += 1
            outcome.last_content = message.content or outcome.last_content
            step = self._native_step if native else self._text_step
            replies, outcome.answer = step(message)
            messages.append(_assistant_message(message))
            messages.extend(replies)
        return outcome

    def _call(self, messages: list[dict[str, Any]], turn: int) -> ChatCompletionMessage:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.config.temperature,
            "max_tokens": self.config.max_tokens,
        }
        if self.config.tools == "native":
            kwargs["tools"] = TOOLS
        if self.config.request_token_ids:
            kwargs["logprobs"] = True
            kwargs["extra_body"] = {"return_token_ids": True}
        response = self.client.chat.completions.create(**kwargs)
        record = {"turn": turn, "messages": messages, "response": response.model_dump()}
        with self.transcript.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
        if not response.choices:
            raise openai.OpenAIError("response has no choices")
        message: ChatCompletionMessage = response.choices[0].message
        return message

    def _text_step(self, message: ChatCompletionMessage) -> tuple[list[dict[str, Any]], str | None]:
        """Act on the first directive: a CALC waits for its RESULT, an ANSWER ends the episode."""
        directive = parse_directive(message.content)
        if directive is None:
            return [{"role": "user", "content": TEXT_NUDGE}], None
        kind, value = directive
        if kind == "ANSWER":
            return [], value
        return [{"role": "user", "content": f"RESULT: {run_calculator(value)}"}], None

    def _native_step(
        self, message: ChatCompletionMessage
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Answer every tool call with a `tool` message; `submit_answer` ends the episode."""
        calls = _function_calls(message)
        if not calls:
            directive = parse_directive(message.content)
            if directive is not None and directive[0] == "ANSWER":
                return [], directive[1]
            return [{"role": "user", "content": NATIVE_NUDGE}], None
        replies: list[dict[str, Any]] = []
        answer: str | None = None
        for call in calls:
            result, submitted = _run_tool(call["function"]["name"], call["function"]["arguments"])
            answer = submitted if submitted is not None else answer
            replies.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        return replies, answer


def _run_tool(name: str, raw_arguments: str) -> tuple[str, str | None]:
    """Return (tool output, submitted answer or None); bad calls become error outputs."""
    try:
        arguments = json.loads(raw_arguments or "{}")
    except json.JSONDecodeError as exc:
        return f"error: arguments are not JSON: {exc}", None
    if not isinstance(arguments, dict):
        return "error: arguments must be a JSON object", None
    if name == "calculator":
        return run_calculator(str(arguments.get("expression", ""))), None
    if name == "submit_answer":
        answer = str(arguments.get("answer", "")).strip()
        return "submitted", answer
    return f"error: unknown tool {name!r}", None


def _function_calls(message: ChatCompletionMessage) -> list[dict[str, Any]]:
    """The message's function tool calls in request form (SDK versions differ in call types)."""
    calls: list[dict[str, Any]] = []
    for call in message.tool_calls or []:
        function = getattr(call, "function", None)
        if function is not None:
            calls.append(
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": function.name, "arguments": function.arguments},
                }
            )
    return calls


def _assistant_message(message: ChatCompletionMessage) -> dict[str, Any]:
    """The assistant turn exactly as received, in request form (content, tool calls)."""
    calls = _function_calls(message)
    if calls:
        return {"role": "assistant", "content": message.content, "tool_calls": calls}
    return {"role": "assistant", "content": message.content or ""}


def main(environ: Mapping[str, str] | None = None) -> int:
    """Run one episode; exit 0 on a normal end (answered or out of turns), 1 on an API error."""
    env = os.environ if environ is None else environ
    try:
        config = AgentConfig.from_env(env)
        client = openai.OpenAI(max_retries=config.max_retries)
        model = config.model or client.models.list().data[0].id
        config.workdir.mkdir(parents=True, exist_ok=True)
        outcome = ToolAgent(client, config, model).run()
    except (openai.OpenAIError, ValueError, IndexError, OSError) as exc:
        print(f"tool_agent: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    final = outcome.answer if outcome.answer is not None else outcome.last_content
    (config.workdir / "answer.txt").write_text(final, encoding="utf-8")
    reason = "answered" if outcome.answer is not None else "max_turns"
    print(f"tool_agent: finished ({reason}) after {outcome.turns} call(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
