"""A stdlib-only agent whose misbehaviour is chosen per task, for the fault-injection suite.

Task fields (from `$POLAR_TASK_FILE`): `calls` chat calls (default 2), `sleep_s` seconds of sleep
after the first call (a window to inject faults in), `ignore_sigterm`, `daemon` (fork a process
that detaches into its own session and sleeps), `hang` (sleep forever after the calls, printing
nothing). Each answered call's response id is appended to `$REL_CALL_LOG/<pid>.txt` as
`<rollout id> <response id>`, so the suite can check that every call the agent saw was logged.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path


def chat(base: str, key: str, messages: list[dict[str, str]]) -> dict[str, object]:
    request = urllib.request.Request(
        f"{base}/chat/completions",
        data=json.dumps({"model": "m", "messages": messages, "max_tokens": 8}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return dict(json.loads(response.read()))


def spawn_daemon() -> None:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(3600)
        os._exit(0)


def main() -> int:
    task = json.loads(Path(os.environ["POLAR_TASK_FILE"]).read_text())
    if task.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if task.get("daemon"):
        spawn_daemon()
    log = Path(os.environ["REL_CALL_LOG"]) / f"{os.getpid()}.txt"
    base, key = os.environ["OPENAI_BASE_URL"].rstrip("/"), os.environ["OPENAI_API_KEY"]
    messages = [{"role": "user", "content": task["instruction"]}]
    for turn in range(int(task.get("calls", 2))):
        reply = chat(base, key, messages)
        with log.open("a") as out:
            out.write(f"{os.environ['POLAR_ROLLOUT_ID']} {reply['id']}\n")
        messages.append({"role": "assistant", "content": "ok"})
        messages.append({"role": "user", "content": "go on"})
        if turn == 0 and task.get("sleep_s"):
            time.sleep(float(task["sleep_s"]))
    if task.get("hang"):
        while True:
            time.sleep(1)
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
