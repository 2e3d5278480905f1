"""The trainer's agent: one chat call through the proxy with the task's instruction, nothing else.

Stdlib only, like any third-party harness it knows just the standard environment
(`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `POLAR_INSTRUCTION`, `POLAR_MODEL`). The job's sampling is
enforced by the proxy, and the evaluator reads the reply as the rollout's last message. Run as
`python -m polar_mq.training.agent`. A seeded job's per-rollout `POLAR_AGENT_SEED` goes out as the
request's `seed`, so the engine's sampling of this rollout can be replayed.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request


def main() -> int:
    body: dict[str, object] = {
        "model": os.environ.get("POLAR_MODEL", "policy"),
        "messages": [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}],
    }
    if os.environ.get("POLAR_AGENT_SEED"):
        body["seed"] = int(os.environ["POLAR_AGENT_SEED"])
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "content-type": "application/json",
            "authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
        },
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.load(response)
    print(answer["choices"][0]["message"]["content"] or "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
