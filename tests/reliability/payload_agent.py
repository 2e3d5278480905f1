"""A stdlib-only agent that sends awkward bytes and tampers with its grader's files, per task.

Task fields (from `$POLAR_TASK_FILE`):
- `payload`: one chat call whose messages are `messages_for(payload)`: `nul` (NUL and other
  control characters in the prompt), `binary` (a tool result holding every byte 0-255 as a
  latin-1 string), `big` (a 10 MB tool result), `poison` (a marker a test trigger refuses);
- `write`: {workspace path: text} files to write after the call (`$HOME` in a path expands);
- `links`: {workspace path: target} symlinks to plant after the call (whatever was there is
  removed first; `$HOME` in a target expands to the agent's home).

The response id is appended to `$REL_CALL_LOG/<pid>.txt` like `agent_script.py` does, so the
suite's invariants check the call was logged. The test imports `messages_for` to know what was
sent.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import urllib.request
from pathlib import Path
from typing import Any

BIG_BYTES = 10 * 1024 * 1024
POISON = "polar-poison-marker"
CONTROL = "".join(chr(c) for c in range(32)) + "\x7f"


def messages_for(payload: str) -> list[dict[str, Any]]:
    """The exact messages of one payload (deterministic: the test rebuilds them)."""
    if payload == "nul":
        text = f"a\x00b \\u0000 literal, \\\x00 {CONTROL} \uffff0 \uffff\uffff \u2028 end\x00"
        return [{"role": "user", "content": text}]
    if payload == "poison":
        return [{"role": "user", "content": f"{POISON} \x00"}]
    call = {"role": "assistant", "content": "running the tool"}
    if payload == "binary":
        return [
            {"role": "user", "content": "dump the file"},
            call,
            {"role": "tool", "tool_call_id": "c1", "content": bytes(range(256)).decode("latin-1")},
        ]
    if payload == "big":
        line = "0123456789abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ +-*/ \x00\n"
        body = (line * (BIG_BYTES // len(line) + 1))[:BIG_BYTES]
        tool = {"role": "tool", "tool_call_id": "c1", "content": body}
        return [{"role": "user", "content": "read the log"}, call, tool]
    raise ValueError(f"unknown payload {payload!r}")


def chat(base: str, key: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base}/chat/completions",
        data=json.dumps({"model": "m", "messages": messages, "max_tokens": 8}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return dict(json.loads(response.read()))


def plant(workdir: Path, links: dict[str, str], files: dict[str, str]) -> None:
    home = os.environ["HOME"]
    for path, text in files.items():
        target = workdir / path.replace("$HOME", home)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text.replace("$HOME", home))
    for path, target in links.items():
        link = workdir / path
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)
        elif link.exists() or link.is_symlink():
            link.unlink()
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target.replace("$HOME", home))


def main() -> int:
    task = json.loads(Path(os.environ["POLAR_TASK_FILE"]).read_text())
    base, key = os.environ["OPENAI_BASE_URL"].rstrip("/"), os.environ["OPENAI_API_KEY"]
    reply = chat(base, key, messages_for(task.get("payload", "nul")))
    log = Path(os.environ["REL_CALL_LOG"]) / f"{os.getpid()}.txt"
    with log.open("a") as out:
        out.write(f"{os.environ['POLAR_ROLLOUT_ID']} {reply['id']}\n")
    plant(Path(os.environ["POLAR_WORKDIR"]), task.get("links", {}), task.get("write", {}))
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
