"""The bench's agent: standard library only, `turns` chat calls through `$OPENAI_BASE_URL`.

It reads its task file (`$POLAR_TASK_FILE`): `turns` (how many chat calls, so the agent's run time
is `turns x` the fake engine's per-call latency) and `p_correct`; it writes `answer.txt` in its
workdir: `1` with probability `p_correct` (seeded by the rollout id), else `0`, so an
`exact_match` evaluator against the task's `answer` "1" gives the group varied rewards.
Any HTTP or protocol error exits 1.
"""

from __future__ import annotations

import json
import os
import random
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

MAX_TOKENS = 16


def chat(url: str, api_key: str, body: dict[str, Any]) -> str:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        reply: dict[str, Any] = json.loads(response.read())
    return str(reply["choices"][0]["message"].get("content") or "")


def main() -> int:
    task = json.loads(Path(os.environ["POLAR_TASK_FILE"]).read_text())
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    history = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": os.environ.get("POLAR_INSTRUCTION", "Say hello.")},
    ]
    turns = int(task.get("turns", 3))
    for turn in range(turns):
        body = {
            "model": os.environ.get("POLAR_MODEL", "default"),
            "messages": history,
            "max_tokens": MAX_TOKENS,
        }
        try:
            content = chat(f"{base}/chat/completions", os.environ["OPENAI_API_KEY"], body)
        except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError) as exc:
            print(f"turn {turn}: chat call failed: {exc!r}", file=sys.stderr)
            return 1
        history.append({"role": "assistant", "content": content})
        history.append({"role": "user", "content": f"Continue ({turn + 1}/{turns})."})
    rng = random.Random(os.environ.get("POLAR_ROLLOUT_ID", ""))
    correct = rng.random() < float(task.get("p_correct", 0.5))
    Path(os.environ["POLAR_WORKDIR"], "answer.txt").write_text("1" if correct else "0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
