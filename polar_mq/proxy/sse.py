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
    """`on_event` sees each JSON event (and may change it in place); by default the event is
    re-serialized as it is. A translated API family passes `render` (the bytes to send for an
    event, possibly none) and `on_done` (the bytes to send for `[DONE]`); then nothing of the
    engine's own framing (comments, `[DONE]`, non-JSON data) reaches the agent."""

    def __init__(
        self,
        on_event: Callable[[dict[str, Any]], object],
        render: Callable[[dict[str, Any]], bytes] | None = None,
        on_done: Callable[[], bytes] | None = None,
    ) -> None:
        self._on_event = on_event
        self._render = render
        self._on_done = on_done
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
        verbatim = raw + b"\n\n" if raw and self._render is None else b""
        if not raw.startswith(b"data:") or b"\n" in raw:
            return verbatim
        payload = raw[5:].strip()
        if payload == DONE:
            self.done = True
            return self._on_done() if self._on_done is not None else b"data: [DONE]\n\n"
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return verbatim
        if not isinstance(obj, dict):
            return verbatim
        self._on_event(obj)
        if self._render is not None:
            return self._render(obj)
        return b"data: " + orjson.dumps(obj) + b"\n\n"
