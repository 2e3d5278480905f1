"""A trivial stdlib-only agent: three chat calls through `$OPENAI_BASE_URL`, then exit 0.

It stands for the cheapest possible agent harness (no SDK, no tools): each turn sends the whole
history to `$OPENAI_BASE_URL/chat/completions` with `Authorization: Bearer $OPENAI_API_KEY`,
appends the assistant's reply and a follow-up user message. Any HTTP or protocol error exits 1.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

TURNS = 3
MAX_TOKENS = 16


def chat(url: str, api_key: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        reply: dict[str, Any] = json.loads(response.read())
    return reply


def main() -> int:
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    api_key = os.environ["OPENAI_API_KEY"]
    model = os.environ.get("POLAR_MODEL", "default")
    instruction = os.environ.get("POLAR_INSTRUCTION", "Say hello.")
    history: list[dict[str, str]] = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": instruction},
    ]
    for turn in range(TURNS):
        try:
            reply = chat(
                f"{base}/chat/completions",
                api_key,
                {"model": model, "messages": history, "max_tokens": MAX_TOKENS},
            )
            content = reply["choices"][0]["message"].get("content") or ""
        except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError) as exc:
            print(f"turn {turn}: chat call failed: {exc!r}", file=sys.stderr)
            return 1
        history.append({"role": "assistant", "content": content})
        history.append({"role": "user", "content": f"Continue ({turn + 1}/{TURNS})."})
    print(history[-2]["content"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
