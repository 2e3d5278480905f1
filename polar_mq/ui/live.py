"""Live pages through server-sent events: the server re-renders a page's live part when it changed.

The API's own event stream (`/v1/jobs/{id}/groups/stream`) *leases* groups to a consumer, so a
dashboard reading it would take deliveries away from the trainer; the dashboard has its own
read-only stream instead, built the same way: each look is one short unit of work in the
threadpool (no connection held while waiting), then an `asyncio.sleep`.

Each look reads a cheap fingerprint of what the page shows (counts by status, rewards, finish
times); only when it differs from the last one sent (or from the one the page was rendered with,
passed as `since`) is the live part rendered again, on the server, with the same autoescaped
template as the page, and sent as an `update` event: `{"html": ..., "done": bool}`. The page's
script swaps it in. `done` (and an `end` event) once nothing will change any more.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass

import orjson
from sqlalchemy.exc import OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import StreamingResponse

log = logging.getLogger(__name__)

POLL_S = 1.0
HEARTBEAT_S = 15.0


@dataclass(frozen=True, slots=True)
class Rendered:
    html: str
    done: bool


class RenderCache:
    """Rendered live parts by (page, its fingerprint digest): one per API process (app.state).

    A page whose fingerprint did not change renders the same HTML, so it is rendered once for
    every viewer and every reload: ten people watching one big job cost one render per change,
    and a finished job's page is rendered once. The live parts hold nothing that depends on who
    looks (access is checked before the cache is asked). Least recently used entries go first.
    """

    def __init__(self, max_entries: int = 64) -> None:
        self._entries: OrderedDict[Hashable, Rendered] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    def get_or_render(self, key: Hashable, render: Callable[[], Rendered]) -> Rendered:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
        page = render()  # outside the lock: renders of different pages run side by side
        with self._lock:
            self._entries[key] = page
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return page


def digest(fingerprint: object) -> str:
    """A short stable hash of a fingerprint, put in the page so its stream starts from it."""
    return hashlib.sha256(repr(fingerprint).encode()).hexdigest()[:16]


def _event(kind: str, data: object) -> bytes:
    return f"event: {kind}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"


def live_stream(
    request: Request,
    fingerprint: Callable[[], object],
    render: Callable[[str], Rendered],
    since: str | None,
    poll_s: float = POLL_S,
) -> StreamingResponse:
    """An SSE response sending `render(digest)` whenever the digest of `fingerprint()` changes
    (both run in threads, each opening its own short session)."""

    async def events() -> AsyncIterator[bytes]:
        yield b"retry: 2000\n\n"
        last = since
        render_s = 0.0
        quiet_since = time.monotonic()
        while not await request.is_disconnected():
            try:
                seen = digest(await run_in_threadpool(fingerprint))
                if seen != last:
                    began = time.monotonic()
                    page = await run_in_threadpool(render, seen)
                    render_s = time.monotonic() - began
                    last = seen
                    quiet_since = time.monotonic()
                    yield _event("update", {"html": page.html, "done": page.done})
                    if page.done:
                        yield _event("end", {})
                        return
            except OperationalError as exc:  # keep the stream; the database may come back
                log.warning("dashboard stream: database unavailable: %s", exc)
                yield b": database unavailable, retrying\n\n"
            if time.monotonic() - quiet_since >= HEARTBEAT_S:
                yield b": heartbeat\n\n"
                quiet_since = time.monotonic()
            # a big page that takes long to render is re-rendered less often (at most half the
            # time of one thread goes to one open tab)
            await asyncio.sleep(max(poll_s, 2 * render_s))

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
