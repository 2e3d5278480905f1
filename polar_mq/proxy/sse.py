"""Server-sent-event relay: re-frames upstream bytes into events and forwards each one at once.

Upstream reads split events arbitrarily; we cut at blank lines, hand each `data:` JSON payload to a
callback (which captures tokens and strips fields in place) and re-serialize it. Anything else
(`[DONE]`, comments, other fields, non-JSON data) is passed through verbatim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

DONE = b"[DONE]"


class SseRelay:
    def __init__(self, on_event: Callable[[dict[str, Any]], object]) -> None:
        self._on_event = on_event
        self._buffer = b""
        self.done = False
        """True once `data: [DONE]` went through."""

    def feed(self, data: bytes) -> bytes:
        """The complete events in `data` (plus what was buffered), transformed, ready to send."""
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        buffer = self._buffer + data if self._buffer else data
        end = buffer.rfind(b"\n\n")
        if end < 0:
            self._buffer = buffer
            return b""
        self._buffer = buffer[end + 2 :]
        return b"".join(self._event(raw) for raw in buffer[:end].split(b"\n\n"))

    def flush(self) -> bytes:
        """Whatever trailing bytes the upstream left without a final blank line."""
        rest, self._buffer = self._buffer, b""
        return self._event(rest) if rest.strip() else b""

    def _event(self, raw: bytes) -> bytes:
        if not raw.startswith(b"data:") or b"\n" in raw:
            return raw + b"\n\n" if raw else b""
        payload = raw[5:].strip()
        if payload == DONE:
            self.done = True
            return b"data: [DONE]\n\n"
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return raw + b"\n\n"
        if not isinstance(obj, dict):
            return raw + b"\n\n"
        self._on_event(obj)
        return b"data: " + orjson.dumps(obj) + b"\n\n"
