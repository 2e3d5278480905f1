"""A command-harness agent that never stops on its own: it calls until the proxy refuses it.

Each turn asks for 1,000 tokens (more than any budget of the test), appends the reply and asks
again; a refusal ends it, printing the error the proxy sent (the e2e test reads it from the log).
It speaks OpenAI chat, or Anthropic Messages when its instruction contains `[anthropic]`.
"""

from __future__ import annotations

import os
import sys

import openai
from openai import OpenAI


def anthropic_main() -> None:
    import anthropic

    client = anthropic.Anthropic(max_retries=0, timeout=30)
    messages: list = [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
    for turn in range(50):
        try:
            reply = client.messages.create(
                model=os.environ["POLAR_MODEL"], messages=messages, max_tokens=1000
            )
        except anthropic.APIStatusError as exc:
            print(f"refused after {turn} calls: HTTP {exc.status_code} {exc.body}")
            sys.exit(1)
        text = "".join(block.text for block in reply.content if block.type == "text")
        messages.append({"role": "assistant", "content": text or "..."})
        messages.append({"role": "user", "content": "Go on."})
    print("never refused")
    sys.exit(2)


def main() -> None:
    if "[anthropic]" in os.environ["POLAR_INSTRUCTION"]:
        anthropic_main()
    client = OpenAI(max_retries=0, timeout=30)
    messages: list = [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
    for turn in range(50):
        try:
            reply = client.chat.completions.create(
                model=os.environ["POLAR_MODEL"], messages=messages, max_tokens=1000
            )
        except openai.APIStatusError as exc:
            print(f"refused after {turn} calls: HTTP {exc.status_code} {exc.body}")
            sys.exit(1)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        messages.append({"role": "user", "content": "Go on."})
    print("never refused")
    sys.exit(2)


if __name__ == "__main__":
    main()
