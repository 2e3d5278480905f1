"""A command-harness agent with a side call after its main loop (e2e test of auxiliary calls).

Like qwen-code's memory extraction, its last LLM call is not the answer: the main loop (a tool call
to `write_notes`, then the final `ANSWER: ...`) is followed by a title call with no tools. It makes
its workspace a git repository first, then writes `notes.txt` (a new file for the diff) and a
transcript (`transcript.json`, declared as an artifact). The fake engine follows the plan named in
the instruction (`[[plan:NAME]]`).
"""

from __future__ import annotations

import json
import os
import subprocess

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_notes",
            "description": "Write notes to a file.",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        },
    }
]


def main() -> None:
    git = ["git", "-c", "user.email=a@b", "-c", "user.name=agent"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "start"], check=True)
    client = OpenAI(max_retries=0, timeout=30)
    model = os.environ["POLAR_MODEL"]
    messages: list = [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
    transcript = []
    for _ in range(4):
        reply = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, temperature=0.0, max_tokens=32000
        )
        message = reply.choices[0].message
        transcript.append(message.model_dump())
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            text = json.loads(call.function.arguments)["text"]
            with open("notes.txt", "w") as handle:
                handle.write(text + "\n")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "written"})
    title = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "Write a five-word title for this conversation."},
            {"role": "user", "content": json.dumps(transcript)},
        ],
        max_tokens=20,
    )
    transcript.append({"title": title.choices[0].message.content})
    with open("transcript.json", "w") as handle:
        json.dump(transcript, handle)


if __name__ == "__main__":
    main()
