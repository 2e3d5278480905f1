"""One keep-alive HTTP/1.1 connection to an engine, and the response read from it.

The proxy's generate calls are all alike (a JSON `POST`, an answer with a length or chunked), so
the upstream client does only that, with as few objects and awaits per call as possible: an
asyncio Protocol parsing with httptools (in C), the request written in one `transport.write`, and
the parser's callbacks filling the connection's fields directly (status, headers, body chunks).
A whole non-streamed answer usually arrives in one read: its head, body and end are parsed in one
`data_received`, and the caller is woken once. A stream is handed on read by read (no re-framing
here; `sse` does that), with reading paused while more than `READ_HIGH_WATER` bytes wait for a
slow agent.

Errors are the `httpx` errors `send` and `capture` sort: the engine closing the connection
before or during the answer is `httpx.RemoteProtocolError` (`httpx.ReadError` for a reset), so a
stale pooled connection is retried once on a new one; a malformed answer is
`httpx.RemoteProtocolError`; no byte for the read timeout is `httpx.ReadTimeout`.

A hostile or broken engine cannot reach past one answer: a head over `MAX_HEADERS` headers or
`MAX_HEAD_BYTES` bytes is a malformed answer (repeated headers are joined in linear time), and
bytes after the end of an answer (past its content length, say) are never parsed as a second
answer: the connection is closed, never reused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import cast

import httptools
import httpx

READ_HIGH_WATER = 256 * 1024
"""Bytes of a streamed answer buffered and not yet taken by the relay before reading pauses."""
NO_BODY_STATUS = frozenset({204, 304})
MAX_HEADERS = 100
"""Headers in an answer's head (as common servers and clients bound it): more is malformed."""
MAX_HEAD_BYTES = 64 * 1024
"""Bytes of an answer's status line and headers: more is malformed (memory stays bounded)."""


class StaleConnection(httpx.RemoteProtocolError):
    """A pooled keep-alive connection broke before any byte of the answer: the engine had closed
    it (its keep-alive timeout racing the call), so the request most likely never reached it and
    may be sent once more on a new connection (`send.send_call`). A new connection that breaks is
    the engine's failure, never this."""


class _Overflow(Exception):
    """Raised in a parser callback to stop httptools (it then raises `HttpParserCallbackError`):
    a head too large or framed ambiguously."""


class UpstreamConnection(asyncio.Protocol):
    """A connection's parser state; one request at a time (no pipelining upstream)."""

    __slots__ = (
        "_buffered",
        "_head_bytes",
        "_head_count",
        "_on_lost",
        "_raw_head",
        "_repeated",
        "_until_eof",
        "chunks",
        "closed",
        "complete",
        "error",
        "head_done",
        "headers",
        "in_use",
        "keep_alive",
        "loop",
        "parser",
        "read_timeout_s",
        "reading_paused",
        "received",
        "status",
        "streaming",
        "transport",
        "waiter",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        read_timeout_s: float,
        on_lost: Callable[[UpstreamConnection], None],
    ) -> None:
        self.loop = loop
        self.read_timeout_s = read_timeout_s
        self._on_lost = on_lost
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.in_use = False
        self.reading_paused = False
        self.streaming = False
        self.waiter: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self._buffered = 0
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self._until_eof = False
        self.error: httpx.TransportError | None = None
        self.received = False  # a byte of this exchange's answer arrived
        self._head_count = 0
        self._head_bytes = 0  # parsed headers' bytes
        self._raw_head = 0  # bytes received while the head was incomplete
        self._repeated: dict[str, list[str]] | None = None

    # the exchange

    def send(self, head: bytes, content: bytes) -> None:
        """Write one request: `head` ends with `content-length: ` (the length follows here)."""
        self._reset()
        self.in_use = True
        self.streaming = False
        assert self.transport is not None
        if self.reading_paused:  # a stream's end arrived over the high water, left unread
            self.reading_paused = False
            self.transport.resume_reading()
        length = b"%d\r\n\r\n" % len(content)
        if len(content) < 65536:
            self.transport.write(head + length + content)
        else:  # a long prompt: not copied once more
            self.transport.writelines((head, length, content))

    async def wait(self) -> None:
        """Until the parser or the connection has news (or the read timeout passes)."""
        self.waiter = waiter = self.loop.create_future()
        timer = self.loop.call_later(self.read_timeout_s, self._timed_out, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    def take_body(self) -> bytes:
        """The body bytes parsed so far (and reading resumed if it had paused)."""
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self.reading_paused and not self.closed:
            self.reading_paused = False
            assert self.transport is not None
            self.transport.resume_reading()
        return data

    def reusable(self) -> bool:
        """Its answer was read to the end and both sides keep the connection."""
        return self.complete and self.keep_alive and self.error is None and not self.closed

    def close(self) -> None:
        self.in_use = False
        if self.transport is not None and not self.closed:
            self.transport.close()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _timed_out(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            self.error = httpx.ReadTimeout(f"no answer within {self.read_timeout_s} s")
            waiter.set_result(None)

    def _fail(self, error: httpx.TransportError) -> None:
        if self.error is None and not self.complete:
            self.error = error
        self._wake()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._on_lost(self)
        if not self.in_use or self.complete:
            return
        if exc is None and self._until_eof and self.head_done:
            self.complete = True  # an answer delimited by the end of the connection
            self._wake()
        elif exc is None:
            self._fail(httpx.RemoteProtocolError("the engine closed the connection"))
        else:
            self._fail(httpx.ReadError(f"{type(exc).__name__}: {exc}"))

    def data_received(self, data: bytes) -> None:
        if not self.in_use or self.complete:  # bytes nobody asked for: out of step
            self.keep_alive = False
            assert self.transport is not None
            self.transport.close()
            return
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:  # callbacks' `_Overflow` included
            self._fail(httpx.RemoteProtocolError(f"malformed answer: {exc}"))
            self.keep_alive = False
            assert self.transport is not None
            self.transport.close()
            return
        if not self.head_done:  # all of `data` was head: httptools may hold a partial header
            self._raw_head += len(data)
            if self._raw_head > MAX_HEAD_BYTES:
                self._head_too_large()
                self.keep_alive = False
                assert self.transport is not None
                self.transport.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport (connection_lost follows)

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self.head_done:  # bytes past the end of the answer: never a second answer
            self.keep_alive = False
            raise _Overflow("bytes after the end of the answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_count += 1
        self._head_bytes += len(name) + len(value) + 4
        if self._head_count > MAX_HEADERS or self._head_bytes > MAX_HEAD_BYTES:
            self._head_too_large()
            raise _Overflow("answer head too large")
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = self.headers
        if key == "transfer-encoding" and (key in headers or text.lower() != "chunked"):
            # Only `chunked`, alone (RFC 9112 6.1; we ask for `accept-encoding: identity`).
            # httptools reads `chunked, gzip` to the end of the connection (a call held until
            # the read timeout) and `gzip, chunked` as chunked (a still-coded body relayed).
            raise _Overflow(f"transfer coding {text!r} refused")
        if key in headers:  # joined once the head is complete: linear in the head's size
            repeated = self._repeated
            if repeated is None:
                self._repeated = repeated = {}
            values = repeated.get(key)
            if values is None:
                repeated[key] = [headers[key], text]
            else:
                values.append(text)
        else:
            headers[key] = text

    def _head_too_large(self) -> None:
        self._fail(
            httpx.RemoteProtocolError(
                f"answer head over {MAX_HEADERS} headers or {MAX_HEAD_BYTES} bytes"
            )
        )

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # 1xx (not asked for): the real answer follows
            self.headers = {}
            self._repeated = None
            self._head_count = self._head_bytes = 0
            return
        if "transfer-encoding" in self.headers and self.parser.get_http_version() == "1.0":
            raise _Overflow("transfer-encoding on HTTP/1.0")  # its framing is faulty (RFC 9112 6.1)
        self.status = status
        self.head_done = True
        headers = self.headers
        repeated = self._repeated
        if repeated is not None:
            for key, values in repeated.items():
                headers[key] = ", ".join(values)
            self._repeated = None
        self._until_eof = (
            "content-length" not in headers
            and "chunked" not in headers.get("transfer-encoding", "")
            and status not in NO_BODY_STATUS
        )
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        if self.streaming:
            self._buffered += len(body)
            if self._buffered > READ_HIGH_WATER and not self.reading_paused:
                self.reading_paused = True
                assert self.transport is not None
                self.transport.pause_reading()
            self._wake()

    def on_message_complete(self) -> None:
        if not self.head_done:
            return  # the end of a 1xx
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True
        self._wake()


class LeanResponse:
    """An upstream answer with the part of `httpx.Response`'s interface the relay uses.

    It holds its connection until `aclose`, which hands it to `release` (the pool's: kept when
    the answer was read to the end, otherwise closed, and vLLM aborts the generation) and calls
    `on_close` once. The pool is passed as its `release` so that this module need not know it.
    """

    __slots__ = ("_conn", "_on_close", "_release", "content", "headers", "status_code")

    def __init__(
        self,
        conn: UpstreamConnection,
        release: Callable[[UpstreamConnection], None],
        on_close: Callable[[], None],
    ) -> None:
        self._conn: UpstreamConnection | None = conn
        self._release = release
        self._on_close: Callable[[], None] | None = on_close
        self.status_code = conn.status
        self.headers = conn.headers
        self.content = b""

    async def aread(self) -> bytes:
        conn = self._conn
        if conn is None:
            return self.content
        conn.streaming = False
        while not conn.complete:
            if conn.error is not None:
                raise conn.error
            await conn.wait()
        self.content = conn.take_body()
        return self.content

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            if self.content:
                yield self.content
            return
        conn.streaming = True
        while self._conn is conn:  # closed meanwhile: the connection may serve another call
            if conn.chunks:
                yield conn.take_body()
            elif conn.complete:
                return
            elif conn.error is not None:
                raise conn.error
            else:
                await conn.wait()

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._release(conn)
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()
