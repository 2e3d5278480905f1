"""A trivial stdlib-only agent: three chat calls through `$OPENAI_BASE_URL`, then exit 0.

It stands for the cheapest possible agent harness (no SDK, no tools): each turn sends the whole
history to `$OPENAI_BASE_URL/chat/completions` with `Authorization: Bearer $OPENAI_API_KEY`,
appends the assistant's reply and a follow-up user message. Any HTTP or protocol error exits 1.

It speaks HTTP/1.1 over one keep-alive socket itself (`socket` and `json` only) rather than
through `urllib.request`, whose import (email, ssl, http.client, ...) cost more CPU than the
three calls: the bench is there to measure polar_mq, not urllib's import time. Plain `http://`
base URLs only, which is what the bench hands it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

TURNS = 3
MAX_TOKENS = 16


class HttpError(Exception):
    pass


class Connection:
    """One keep-alive HTTP/1.1 connection to the base URL's host."""

    def __init__(self, base: str) -> None:
        if not base.startswith("http://"):
            raise HttpError(f"only http:// base URLs: {base}")
        hostport, _, path = base[len("http://") :].partition("/")
        host, _, port = hostport.partition(":")
        self.host = hostport
        self.address = (host, int(port or 80))
        self.prefix = "/" + path if path else ""
        self._connect()

    def _connect(self) -> None:
        self.sock = socket.create_connection(self.address, timeout=60)
        self.file = self.sock.makefile("rb")

    def post(self, path: str, api_key: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        head = (
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Content-Type: application/json\r\nAuthorization: Bearer {api_key}\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + data)
        status = self.file.readline().split(None, 2)
        if len(status) < 2:
            raise HttpError("connection closed")
        headers: dict[str, str] = {}
        while (line := self.file.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            payload = self._chunked()
        elif "content-length" in headers:
            payload = self.file.read(int(headers["content-length"]))
        else:
            payload = self.file.read()  # delimited by the server closing
            headers["connection"] = "close"
        if headers.get("connection", "").lower() == "close":
            self.sock.close()
            self._connect()
        if status[1] != b"200":
            raise HttpError(f"HTTP {status[1].decode()}: {payload[:200]!r}")
        reply: dict[str, Any] = json.loads(payload)
        return reply

    def _chunked(self) -> bytes:
        parts = []
        while size := int(self.file.readline().split(b";")[0], 16):
            parts.append(self.file.read(size))
            self.file.readline()
        while self.file.readline() not in (b"\r\n", b"\n", b""):
            pass  # trailers
        return b"".join(parts)


def main() -> int:
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    api_key = os.environ["OPENAI_API_KEY"]
    model = os.environ.get("POLAR_MODEL", "default")
    instruction = os.environ.get("POLAR_INSTRUCTION", "Say hello.")
    history: list[dict[str, str]] = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": instruction},
    ]
    try:
        connection = Connection(base)
    except (HttpError, OSError, ValueError) as exc:
        print(f"cannot reach {base}: {exc!r}", file=sys.stderr)
        return 1
    for turn in range(TURNS):
        try:
            reply = connection.post(
                "/chat/completions",
                api_key,
                {"model": model, "messages": history, "max_tokens": MAX_TOKENS},
            )
            content = reply["choices"][0]["message"].get("content") or ""
        except (HttpError, OSError, KeyError, IndexError, ValueError) as exc:
            print(f"turn {turn}: chat call failed: {exc!r}", file=sys.stderr)
            return 1
        history.append({"role": "assistant", "content": content})
        history.append({"role": "user", "content": f"Continue ({turn + 1}/{TURNS})."})
    print(history[-2]["content"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
