"""Close a connection whose request head does not arrive in time (half-sent headers, slowloris).

uvicorn (the API) and the proxy's own server wait for a
request's line and headers for as long as the client keeps the connection open: uvicorn arms its
keep-alive timer only after a response and cancels it on any byte, and a connection that never
sends one has no timer at all. So clients that send half a head and stall (or nothing) each hold
a connection and its buffers forever; 300 of them stayed open 75 s and more. The body has its
deadline already (`body_timeout`, in the app); the head must be cut below the app, in the server,
since the app sees no request before the head is complete.

`HeadDeadline` is the timer both servers use: armed when a connection opens and when a request's
first byte arrives, disarmed when its head is complete (`header_read_timeout_s`, default 10 s).
On expiry a connection that received part of a head gets a 408 and is closed; one that received
nothing is closed; one still serving an earlier request (a pipelined head stalls behind it)
finishes that response and then closes; while the server itself has paused reading (pipelined
requests queued, a body not yet consumed) the clock starts over. `header_timeout_protocol` is
uvicorn's httptools protocol with the deadline, passed to uvicorn as its `http` class.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def timeout_response(timeout_s: float) -> bytes:
    """The 408 sent to a connection whose head did not arrive whole within `timeout_s`."""
    body = f"request headers not received within {timeout_s:g} s".encode()
    return (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%b" % (len(body), body)
    )


class HeadDeadline:
    """One connection's head timer; `expire` runs when a head is late."""

    __slots__ = ("_handle", "expire", "loop", "timeout_s")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, timeout_s: float, expire: Callable[[], None]
    ) -> None:
        self.loop = loop
        self.timeout_s = timeout_s
        self.expire = expire
        self._handle: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        """Start the clock unless it runs already (a head's first byte after the connection's)."""
        if self._handle is None:
            self._handle = self.loop.call_later(self.timeout_s, self._fire)

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self.expire()


def close_late(transport: asyncio.Transport, head_started: bool, timeout_s: float) -> None:
    """Close an idle connection whose head is late: a 408 first if part of a head came."""
    if transport.is_closing():
        return
    if head_started:
        transport.write(timeout_response(timeout_s))
    transport.close()


class HeadDeadlineHooks:
    """The parser callbacks that arm and disarm a connection's `HeadDeadline`: mixed in before an
    httptools-based protocol class (uvicorn's, the proxy's lean server's), which sets
    `head_deadline` in its constructor and says in `_head_late` what a late head means to it."""

    head_deadline: HeadDeadline
    head_started: bool = False

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self.head_deadline.arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.head_deadline.disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def on_message_begin(self) -> None:
        super().on_message_begin()  # type: ignore[misc]
        self.head_started = True
        self.head_deadline.arm()

    def on_headers_complete(self) -> None:
        self.head_deadline.disarm()
        self.head_started = False
        super().on_headers_complete()  # type: ignore[misc]


class _DeadlineHttpTools(HeadDeadlineHooks, HttpToolsProtocol):
    """uvicorn's httptools protocol with a `HeadDeadline` (see the module docstring)."""

    header_timeout_s: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_deadline = HeadDeadline(self.loop, self.header_timeout_s, self._head_late)

    def _head_late(self) -> None:
        if self.flow is not None and self.flow.read_paused:
            self.head_deadline.arm()  # the server stopped reading, not the client sending
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.shutdown()  # a pipelined head is late: finish the response in hand, then close
            return
        close_late(self.transport, self.head_started, self.header_timeout_s)


def header_timeout_protocol(timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol closing connections whose head is later than `timeout_s`
    (give it to uvicorn as `http=`)."""
    return type("HeaderTimeoutHttpTools", (_DeadlineHttpTools,), {"header_timeout_s": timeout_s})
