"""One HTTP/1.1 connection of the lean proxy server: an asyncio Protocol parsing with httptools.

uvicorn is a general server: per request it builds flow-control objects and events, normalises
headers, and writes the head and the body separately. This one does only what the proxy's clients
need, with as few objects as possible: the ASGI scope is built once from the parsed head, a
complete body is handed to the app in one message without waiting, and a response with a length
is written as head and body in one `transport.write` (`fast_path`'s plain responses skip the ASGI
messages altogether: the `polar_mq.whole_response` scope extension). Streams (no length) are sent
chunked, a chunk per `send`. Kept: keep-alive, pipelining (requests queue behind the one served),
reading paused while a body is not consumed, writing paused when the socket is full, `Expect:
100-continue`, and a client hang-up (the app's `receive` returns `http.disconnect`; a `send` after
it raises `ClientDisconnected`, an `OSError` as ASGI 2.4 asks). A malformed or ambiguously framed
request is a 400 and the connection closes (against smuggling: httptools' lenient flags stay off,
and what it would still read as chunked, `gzip, chunked`, two `transfer-encoding` headers, chunked
on HTTP/1.0, is refused here: RFC 9112 6.1); an `Upgrade` request goes to uvicorn's protocol
(`http_server.handoff`) if it starts the input, else is refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools
from starlette.types import ASGIApp, Message

logger = logging.getLogger(__name__)

ASGI_INFO = {"version": "3.0", "spec_version": "2.4"}
READ_HIGH_WATER = 256 * 1024
"""Bytes of a request body buffered and not yet received by the app before reading pauses."""
MAX_QUEUED = 16
"""Pipelined requests waiting behind the one served before reading pauses."""
HANDOFF_MAX = 64 * 1024
"""Bytes of a connection's first input kept in case it must be handed to uvicorn."""
MAX_HEAD_BYTES = 64 * 1024
"""Request line and headers together: more is a 400 and the connection closes (a client
streaming endless headers must not grow a connection's memory without bound)."""

WHOLE_RESPONSE = "polar_mq.whole_response"
"""Scope extension: `write_whole(status, headers, body)` sends a complete response at once."""
DISCONNECT: Message = {"type": "http.disconnect"}
BAD_REQUEST = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 11\r\nconnection: close\r\n\r\nBad Request"
)
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
NO_BODY_STATUS = frozenset({204, 304})
_STATUS_LINES = {
    s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode("latin-1")) for s in HTTPStatus
}
_date: list[Any] = [0, b""]


class ClientDisconnected(OSError):
    """A response `send` after the client hung up (ASGI 2.4)."""


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


def _date_header(now: float) -> bytes:
    """`date: ...\r\n`, formatted once per second (RFC 9110 asks origin servers for it)."""
    second = int(now)
    if _date[0] != second:
        _date[0] = second
        _date[1] = b"date: " + formatdate(second, usegmt=True).encode() + b"\r\n"
    value: bytes = _date[1]
    return value


class Cycle:
    """One request and its response: the app's `receive` and `send`."""

    __slots__ = (
        "_waiter",
        "body",
        "buffered",
        "chunked",
        "complete",
        "conn",
        "continue_wanted",
        "delivered",
        "done",
        "head_sent",
        "headers",
        "keep_alive",
        "scope",
        "status",
    )

    def __init__(self, conn: Connection, scope: dict[str, Any], keep_alive: bool) -> None:
        self.conn = conn
        self.scope = scope
        self.keep_alive = keep_alive
        self.body: list[bytes] = []
        self.buffered = 0
        self.complete = False  # the whole request body was parsed
        self.delivered = False  # ... and handed to the app
        self.done = False  # the whole response was written
        self.head_sent = False
        self.chunked = False
        self.continue_wanted = False
        self.status = 0
        self.headers: Any = ()
        self._waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def receive(self) -> Message:
        conn = self.conn
        while True:
            if conn.disconnected or self.done:
                return DISCONNECT
            if self.body or (self.complete and not self.delivered):
                body = self.body
                data = body[0] if len(body) == 1 else b"".join(body)
                body.clear()
                self.buffered = 0
                if conn.reading_paused:
                    conn.resume_reading()
                self.delivered = self.complete
                return {"type": "http.request", "body": data, "more_body": not self.complete}
            if self.continue_wanted and not self.head_sent:
                self.continue_wanted = False
                conn.transport.write(CONTINUE)
            self._waiter = waiter = conn.loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    async def send(self, message: Message) -> None:
        conn = self.conn
        kind = message["type"]
        if kind == "http.response.start":
            if self.status:
                raise RuntimeError("http.response.start sent twice")
            self.status = message["status"]
            self.headers = message.get("headers", ())
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if conn.disconnected:
            raise ClientDisconnected("the client closed the connection")
        if self.done or not self.status:
            raise RuntimeError("http.response.body without a response in progress")
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        write = conn.transport.write
        if not self.head_sent:
            self.head_sent = True
            head = self._head(len(body), more)
            if not self._has_body():
                write(head)
            elif self.chunked:
                write(head + (b"%x\r\n%b\r\n" % (len(body), body) if body else b""))
            else:
                write(head + body)
        elif self._has_body() and body:
            write(b"%x\r\n%b\r\n" % (len(body), body) if self.chunked else body)
        if more:
            if conn.writing_paused:
                await conn.drain()
            return
        if self.chunked and self._has_body():
            write(b"0\r\n\r\n")
        self.done = True
        self.wake()

    def write_whole(self, status: int, headers: Any, body: bytes) -> None:
        """A complete response in one write, without the two ASGI messages (`fast_path` sends
        its plain responses so, through the scope's `polar_mq.whole_response` extension)."""
        if self.conn.disconnected or self.status:
            return
        self.status, self.headers = status, headers
        self.head_sent = self.done = True
        head = self._head(len(body), False)
        self.conn.transport.write(head + body if self._has_body() else head)
        self.wake()

    def _has_body(self) -> bool:
        return self.status not in NO_BODY_STATUS and self.scope["method"] != "HEAD"

    def _head(self, size: int, more: bool) -> bytes:
        """Status line and headers; decides the framing and whether the connection stays open."""
        parts = [_status_line(self.status)]
        has_length = close_named = False
        for name, value in self.headers:
            lower = name.lower()
            if lower == b"content-length":
                has_length = True
            elif lower == b"transfer-encoding":
                continue  # we frame the body ourselves
            elif lower == b"connection" and value.lower() == b"close":
                self.keep_alive = False
                close_named = True
            parts += (name, b": ", value, b"\r\n")
        if not self.complete:  # the body is not consumed: the connection cannot be reused
            self.keep_alive = False
        if not has_length and self._has_body():
            if not more:
                parts.append(b"content-length: %d\r\n" % size)
            elif self.scope["http_version"] == "1.1":
                self.chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
            else:  # HTTP/1.0 stream: delimited by closing
                self.keep_alive = False
        if not self.keep_alive and not close_named:
            parts.append(b"connection: close\r\n")
        parts.append(_date_header(self.conn.loop.time() + self.conn.clock_offset))
        parts.append(b"\r\n")
        return b"".join(parts)


class Connection(asyncio.Protocol):
    """Parses requests, runs each as a task of the ASGI app, one at a time, in order."""

    def __init__(
        self,
        app: ASGIApp,
        connections: set[Connection],
        keepalive_s: float,
        clock_offset: float,
        handoff: Callable[[Connection, bytes], bool],
    ) -> None:
        self.app = app
        self.connections = connections
        self.keepalive_s = keepalive_s
        self.clock_offset = clock_offset  # wall clock minus loop clock, for the date header
        self.handoff = handoff
        self.loop = asyncio.get_event_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.disconnected = False
        self.closing = False  # finish the request in hand, then close (server shutdown)
        self.reading_paused = False
        self.writing_paused = False
        self._drained: asyncio.Future[None] | None = None
        self.current: Cycle | None = None  # being served
        self.parsing: Cycle | None = None  # being parsed (the same, or a queued one)
        self.queue: deque[Cycle] = deque()
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0  # request line and headers so far (`MAX_HEAD_BYTES`)
        self._in_message = False
        self._bad = False  # an unparseable request came: answer 400 after the one in hand
        self._first_input: list[bytes] | None = []
        self._idle: asyncio.TimerHandle | None = None
        self._client: Any = None
        self._server: Any = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not subclasses
        self.connections.add(self)
        self._client = transport.get_extra_info("peername")
        self._server = transport.get_extra_info("sockname")
        if not isinstance(self._client, tuple):  # a Unix socket
            self._client = None
        if not isinstance(self._server, tuple):
            self._server = None
        self._idle = self.loop.call_later(self.keepalive_s, self._close_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self.disconnected = True
        self.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        for cycle in (self.current, *self.queue):
            if cycle is not None:
                cycle.wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        first = self._first_input
        if first is not None:
            first.append(data)
            if sum(map(len, first)) > HANDOFF_MAX:
                self._first_input = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._upgrade()
        except httptools.HttpParserError:
            self._bad_request()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drain(self) -> None:
        if self.writing_paused and not self.disconnected:
            self._drained = self.loop.create_future()
            await self._drained

    def pause_reading(self) -> None:
        if not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and not self.disconnected:
            self.reading_paused = False
            self.transport.resume_reading()

    # httptools callbacks

    def on_message_begin(self) -> None:
        self._in_message = True
        self._url = b""
        self._headers = []
        self._head_bytes = 0

    def _count_head(self, size: int) -> None:
        """Raising in a parser callback makes httptools fail the feed: a 400 (`_bad_request`)."""
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            raise ValueError(f"request head over {MAX_HEAD_BYTES} bytes")

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        lower = name.lower()
        if lower == b"transfer-encoding" and (  # `chunked` alone, on HTTP/1.1: see the module doc
            value.lower() != b"chunked" or self.parser.get_http_version() != "1.1"
        ):
            raise ValueError(f"transfer coding {value!r} refused")  # a 400
        self._headers.append((lower, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        if parser.should_upgrade():
            return  # httptools raises HttpParserUpgrade once it returns: `_upgrade` takes it
        raw_path, _, query = self._url.partition(b"?")
        path = raw_path.decode("latin-1")
        if "%" in path:
            path = unquote(path)
        scope = {
            "type": "http",
            "asgi": ASGI_INFO,
            "http_version": parser.get_http_version(),
            "server": self._server,
            "client": self._client,
            "scheme": "http",
            "method": parser.get_method().decode("ascii"),
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "headers": self._headers,
        }
        cycle = Cycle(self, scope, parser.should_keep_alive() and not self.closing)
        scope["extensions"] = {WHOLE_RESPONSE: cycle.write_whole}
        if (b"expect", b"100-continue") in self._headers:
            cycle.continue_wanted = True
        self.parsing = cycle
        if self.current is None:
            self._start(cycle)
        else:
            self.queue.append(cycle)
            if len(self.queue) >= MAX_QUEUED:
                self.pause_reading()

    def on_body(self, body: bytes) -> None:
        cycle = self.parsing
        if cycle is None or cycle.done:
            return
        cycle.body.append(body)
        cycle.buffered += len(body)
        if cycle.buffered > READ_HIGH_WATER:
            self.pause_reading()
        cycle.wake()

    def on_message_complete(self) -> None:
        self._in_message = False
        if not self.parser.should_upgrade():  # what follows is no longer the first request
            self._first_input = None
        cycle = self.parsing
        if cycle is not None:
            cycle.complete = True
            cycle.wake()
        self.parsing = None

    # serving

    def _start(self, cycle: Cycle) -> None:
        self.current = cycle
        self.loop.create_task(self._serve(cycle))

    async def _serve(self, cycle: Cycle) -> None:
        try:
            await self.app(cycle.scope, cycle.receive, cycle.send)
        except ClientDisconnected:
            pass
        except Exception:
            if not self.disconnected:
                logger.exception("the proxy app failed on %s", cycle.scope["path"])
                if not cycle.head_sent:
                    self._internal_error(cycle)
        finally:
            self._finished(cycle)

    def _internal_error(self, cycle: Cycle) -> None:
        body = b"Internal Server Error"
        cycle.status, cycle.headers, cycle.keep_alive = 500, (), False
        cycle.head_sent = cycle.done = True
        head = cycle._head(len(body), False)
        self.transport.write(head + body if cycle._has_body() else head)

    def _finished(self, cycle: Cycle) -> None:
        self.current = None
        if self.disconnected:
            return
        if not cycle.done:  # the app returned without completing its response
            if not cycle.head_sent:
                logger.error("the proxy app sent no response on %s", cycle.scope["path"])
                self._internal_error(cycle)
            self.transport.close()
            return
        if not cycle.keep_alive or self.closing or self._bad:
            if self._bad:
                self.transport.write(BAD_REQUEST)
            self.transport.close()
            return
        if self.queue:
            self._start(self.queue.popleft())
            if len(self.queue) < MAX_QUEUED and (
                self.parsing is None or self.parsing.buffered <= READ_HIGH_WATER
            ):
                self.resume_reading()
        elif not self._in_message:
            self._idle = self.loop.call_later(self.keepalive_s, self._close_idle)

    def _close_idle(self) -> None:
        self._idle = None
        if self.current is None and not self._in_message and not self.queue:
            self.transport.close()

    def shutdown(self) -> None:
        """The server stops: close now when idle, else after the response in hand."""
        self.closing = True
        if self.current is None and not self.queue:
            self.transport.close()

    def _bad_request(self) -> None:
        """One 400 for the malformed request, then close. A malformed body of the request in
        hand (a bad chunk) is answered at once: its app gets `http.disconnect` instead of
        waiting for a body that will never come, and nothing it sends goes out."""
        parsing, current = self.parsing, self.current
        self.parsing = None
        self.queue.clear()  # what came after an unparseable request is not trusted either
        if current is None or (parsing is current and not current.head_sent):
            if current is not None:
                current.status = 400
                current.head_sent = current.done = True
            self.transport.write(BAD_REQUEST)
            self.disconnected = True  # the app's sends are dropped from now on
            self.transport.close()
            if current is not None:
                current.wake()
        elif parsing is current:  # its response is under way: finish it, then close
            current.keep_alive = False
            self.pause_reading()
        else:  # a pipelined request: answer the request in hand, then 400 and close
            self._bad = True
            self.pause_reading()

    def _upgrade(self) -> None:
        """An `Upgrade` request: to uvicorn if it is this connection's first input, else 400."""
        first = self._first_input
        if self.current is None and first is not None and self.handoff(self, b"".join(first)):
            self.connections.discard(self)
            return
        self._bad_request()
