"""A command-harness agent for the dashboard browser test (stdlib only).

It waits until the test opens its gate (a file named in the task instance), so the test decides
when each group's rollouts may finish and can watch the dashboard's counts move one group at a
time. Then it makes two chat calls through the proxy (the second continues the first's
conversation), prints a log line carrying an HTML payload (the dashboard must show it as text) and
writes an answer that is right for about half of the rollouts, so rewards differ within groups.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

XSS_LOG = "<script>window.__xss_log = 1</script>"


def chat(messages: list[dict[str, str]]) -> str:
    model = os.environ.get("POLAR_MODEL", "default")
    body = {"model": model, "messages": messages, "max_tokens": 12, "logprobs": True}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.loads(response.read())
    return str(answer["choices"][0]["message"]["content"] or "")


def main() -> None:
    task = json.loads(Path(os.environ["POLAR_TASK_FILE"]).read_text())
    gate = Path(task["gate"])
    deadline = time.monotonic() + 600
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    messages = [{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
    first = chat(messages)
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "sure?"}]
    second = chat(messages)
    print(f"agent log: first={first!r} second={second!r} {XSS_LOG}", flush=True)
    right = int(os.environ["POLAR_ROLLOUT_ID"].replace("-", ""), 16) % 2 == 0
    answer = task["answer"] if right else "wrong"
    (Path(os.environ["POLAR_WORKDIR"]) / "answer.txt").write_text(f"ANSWER: {answer}\n")


if __name__ == "__main__":
    main()
