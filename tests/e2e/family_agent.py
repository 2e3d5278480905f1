"""A command-harness agent that speaks one API family through the official SDK (e2e tests).

`python family_agent.py anthropic|responses|gemini` runs a calculator tool loop for the
instruction in `POLAR_INSTRUCTION` against the proxy, reading its base URL and key from the
variables polar_mq sets for every harness (`ANTHROPIC_BASE_URL`/`ANTHROPIC_API_KEY`,
`OPENAI_BASE_URL`/`OPENAI_API_KEY`, `GOOGLE_GEMINI_BASE_URL`/`GEMINI_API_KEY`), and prints the
final answer. The history is re-sent whole each turn, as Claude Code, Codex and Gemini CLI do.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

SCHEMA = {
    "type": "object",
    "properties": {"expression": {"type": "string"}},
    "required": ["expression"],
}
MAX_TURNS = 4


def calculate(expression: str) -> str:
    allowed = set("0123456789+-*/(). ")
    if not set(expression) <= allowed:
        return "error: not arithmetic"
    return str(round(eval(expression), 6)).removesuffix(".0")  # arithmetic only (checked above)


def anthropic_loop(instruction: str) -> str:
    import anthropic

    client = anthropic.Anthropic(max_retries=0, timeout=30)
    tools: Any = [{"name": "calculator", "description": "Arithmetic.", "input_schema": SCHEMA}]
    messages: list[Any] = [{"role": "user", "content": instruction}]
    for _ in range(MAX_TURNS):
        reply = client.messages.create(
            model="claude-sonnet-4-5", max_tokens=512, tools=tools, messages=messages
        )
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            return "".join(b.text for b in reply.content if b.type == "text")
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        results = [
            {
                "type": "tool_result",
                "tool_use_id": u.id,
                "content": calculate(u.input["expression"]),
            }
            for u in uses
        ]
        messages.append({"role": "user", "content": results})
    return ""


def responses_loop(instruction: str) -> str:
    import openai

    client = openai.OpenAI(max_retries=0, timeout=30)
    tools: Any = [{"type": "function", "name": "calculator", "parameters": SCHEMA}]
    items: list[Any] = [{"role": "user", "content": instruction}]
    for _ in range(MAX_TURNS):
        reply = client.responses.create(model="gpt-5-codex", input=items, tools=tools, store=False)
        calls = [item for item in reply.output if item.type == "function_call"]
        if not calls:
            return reply.output_text
        items += [item.model_dump(exclude_none=True) for item in reply.output]
        for call in calls:
            result = calculate(json.loads(call.arguments)["expression"])
            items.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": result}
            )
    return ""


def gemini_loop(instruction: str) -> str:
    from google import genai
    from google.genai import types

    client = genai.Client(
        api_key=os.environ["GEMINI_API_KEY"],
        http_options=types.HttpOptions(base_url=os.environ["GOOGLE_GEMINI_BASE_URL"]),
    )
    declaration = types.FunctionDeclaration(
        name="calculator", description="Arithmetic.", parameters_json_schema=SCHEMA
    )
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[declaration])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    contents: list[Any] = [types.Content(role="user", parts=[types.Part(text=instruction)])]
    for _ in range(MAX_TURNS):
        reply = client.models.generate_content(
            model="gemini-2.5-pro", contents=contents, config=config
        )
        calls = reply.function_calls or []
        if not calls:
            return reply.text or ""
        assert reply.candidates and reply.candidates[0].content
        contents.append(reply.candidates[0].content)
        parts = [
            types.Part(
                function_response=types.FunctionResponse(
                    name=call.name,
                    id=call.id,
                    response={"output": calculate((call.args or {})["expression"])},
                )
            )
            for call in calls
        ]
        contents.append(types.Content(role="user", parts=parts))
    return ""


LOOPS = {"anthropic": anthropic_loop, "responses": responses_loop, "gemini": gemini_loop}


def main() -> int:
    answer = LOOPS[sys.argv[1]](os.environ["POLAR_INSTRUCTION"])
    print(answer)
    return 0 if answer else 1


if __name__ == "__main__":
    sys.exit(main())
