"""A command-harness agent for the early-stop end-to-end tests (stdlib only).

Which samples are slow is decided deterministically per group: each sample, as it starts, takes
the next free slot of its task (an atomic `mkdir` in a directory shared by the test). The first
`fast_samples` slots (from the task instance, default: all) wait until every sample of the group
has started, make one chat call through the proxy and exit 0; the others are stragglers that sleep
for `--slow-s`, far longer than the test lasts, so only an early stop can end them. `--marker`
only puts a token in the command line, for the test's leaked-process check.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
import urllib.request
from pathlib import Path


def take_slot(group: Path, size: int) -> int:
    group.mkdir(parents=True, exist_ok=True)
    for k in range(size):
        try:
            (group / str(k)).mkdir()
        except FileExistsError:
            continue
        (group / str(k) / "rollout").write_text(os.environ["POLAR_ROLLOUT_ID"])
        return k
    return size


def chat(instruction: str) -> None:
    body = {
        "model": os.environ.get("POLAR_MODEL", "default"),
        "messages": [{"role": "user", "content": instruction}],
        "max_tokens": 8,
    }
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        json.loads(response.read())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slots", required=True, type=Path)
    parser.add_argument("--size", required=True, type=int, help="samples per task")
    parser.add_argument("--slow-s", type=float, default=600.0)
    parser.add_argument("--marker", default="")
    args = parser.parse_args()
    task = json.loads(Path(os.environ["POLAR_TASK_FILE"]).read_text())
    fast = int(task.get("fast_samples", args.size))
    instruction = os.environ["POLAR_INSTRUCTION"]
    group = args.slots / hashlib.sha256(instruction.encode()).hexdigest()[:16]
    if take_slot(group, args.size) >= fast:
        time.sleep(args.slow_s)
        return
    deadline = time.monotonic() + 20  # let the stragglers start, so the stop has agents to kill
    while not (group / str(args.size - 1)).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    chat(instruction)


if __name__ == "__main__":
    main()
