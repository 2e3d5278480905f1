"""HTTP conformance of the proxy's own server and upstream client, over real sockets.

A real proxy (the lean server, the own upstream pool) runs in a thread in front of a hostile
upstream: a raw asyncio TCP server in another thread whose answers each test scripts byte by
byte. Agents are raw sockets. Each test is one defect an HTTP probe found (issue 36): a malformed
request body, bytes past an answer's end, a flood of repeated headers, an oversize head, a
non-JSON error body, and a failure before the first byte sent upstream twice.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from proxy_support import SECRET, proxy_settings

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.proxy.backends.upstream_conn import UpstreamConnection
from polar_mq.testing.servers import serve_in_thread

pytestmark = pytest.mark.slow

CHAT = b"/v1/chat/completions"
Script = Callable[[asyncio.StreamWriter, int], Awaitable[bool]]
"""Answers the n-th call (from 1) on `writer`; returns whether the connection stays open."""

ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "fake-model",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "5"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
CHUNK = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "fake-model",
    "choices": [{"index": 0, "delta": {"content": "5"}, "finish_reason": "stop"}],
}
EVENTS = b"data: " + orjson.dumps(CHUNK) + b"\n\ndata: [DONE]\n\n"
INJECTED = b'data: {"injected": true}\n\n'


def answer(body: bytes, *, status: bytes = b"200 OK", ctype: bytes = b"application/json") -> bytes:
    head = b"HTTP/1.1 " + status + b"\r\ncontent-type: " + ctype + b"\r\n"
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


class Hostile:
    """A raw upstream in its own thread: `/health` is answered, every call goes to `script`."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.calls = 0
        """Calls received (health checks apart)."""
        self.call_connections = 0
        """Connections that carried a call."""
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hostile-upstream", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Hostile:
        self._thread.start()
        assert self._ready.wait(10), "the hostile upstream did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _stop(self) -> None:
        """Close the server and end its connections' handlers (some wait forever) in the loop."""
        assert self._server is not None
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counted = False
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lower = head.lower()
                length = 0
                if b"content-length: " in lower:
                    length = int(lower.split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                if head.split(b" ")[1] == b"/health":
                    writer.write(answer(b"{}"))
                    continue
                self.calls += 1
                if not counted:
                    counted = True
                    self.call_connections += 1
                if not await self.script(writer, self.calls):
                    await writer.drain()
                    break
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@dataclass
class Proxy:
    port: int
    sink: MemoryCallSink

    def rows(self, count: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """The first `count` call rows, once logged (the relay logs after the last byte)."""
        deadline = time.monotonic() + timeout_s
        while len(self.sink.rows) < count:
            assert time.monotonic() < deadline, f"{len(self.sink.rows)} rows, wanted {count}"
            time.sleep(0.01)
        return self.sink.rows[:count]

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=120)

    def call(self, stream: bool = False) -> tuple[int, dict[bytes, bytes], bytes]:
        """One chat call on a new connection (`connection: close`): status, headers, body."""
        message = {"model": "fake-model", "messages": [{"role": "user", "content": "2 + 3?"}]}
        body = orjson.dumps({**message, "stream": stream})
        with self.connect() as sock:
            sock.sendall(head(b"content-length: %d\r\n" % len(body)) + body)
            status, headers, raw = parse(read_all(sock))
        return status, headers, raw


@contextmanager
def proxy_over(hostile: Hostile) -> Iterator[Proxy]:
    sink = MemoryCallSink()
    settings = proxy_settings(upstream_url=hostile.url)
    app = create_proxy_app(settings, sink=sink)
    with serve_in_thread(app, server="lean") as url:
        yield Proxy(int(url.rsplit(":", 1)[1]), sink)


@contextmanager
def stack(script: Script) -> Iterator[tuple[Hostile, Proxy]]:
    with Hostile(script) as hostile, proxy_over(hostile) as proxy:
        yield hostile, proxy


def head(extra: bytes) -> bytes:
    token = issue_rollout_token(SECRET, uuid.uuid4(), 600).encode()
    return (
        b"POST " + CHAT + b" HTTP/1.1\r\nhost: proxy\r\nconnection: close\r\n"
        b"authorization: Bearer "
        + token
        + b"\r\ncontent-type: application/json\r\n"
        + extra
        + b"\r\n"
    )


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def parse(data: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    """One response: status, headers (lower-case names; a repeated one fails), whole body."""
    raw_head, _, rest = data.partition(b"\r\n\r\n")
    lines = raw_head.split(b"\r\n")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        assert key not in headers, f"header {key!r} sent twice: {raw_head!r}"
        headers[key] = value.strip()
    if headers.get(b"transfer-encoding") == b"chunked":
        body = b""
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                rest = rest.removeprefix(b"\r\n")
                break
            body, rest = body + rest[:size], rest[size + 2 :]
    else:
        size = int(headers[b"content-length"])
        body, rest = rest[:size], rest[size:]
    assert rest == b"", f"bytes after the response: {rest[:200]!r}"
    return int(lines[0].split(b" ")[1]), headers, body


def test_a_malformed_chunked_body_gets_one_400_at_once_and_the_connection_closes() -> None:
    """Was: the request held until the body timeout (30 s), a 408 with `connection: close`
    twice, then an unrequested 400 on the same connection."""

    async def unused(writer: asyncio.StreamWriter, n: int) -> bool:
        raise AssertionError("a malformed request must not reach the upstream")

    with stack(unused) as (hostile, proxy), proxy.connect() as sock:
        sock.sendall(head(b"transfer-encoding: chunked\r\n") + b'5\r\n{"mod\r\nzz\r\n')
        status, headers, body = parse(read_all(sock))  # one response, then the close
        assert (status, headers[b"connection"], body) == (400, b"close", b"Bad Request")
        assert hostile.calls == 0


@pytest.mark.parametrize("stream", [False, True])
def test_bytes_past_an_answers_end_are_never_delivered_and_its_connection_is_closed(
    stream: bool,
) -> None:
    """Was: the bytes after the content length parsed as a second answer (a stream relayed an
    injected event after `[DONE]`, a plain call got a 500 and was not logged) and the
    connection went back to the pool."""

    async def poisoned(writer: asyncio.StreamWriter, n: int) -> bool:
        if stream:
            body = answer(EVENTS, ctype=b"text/event-stream")
            extra = answer(INJECTED, ctype=b"text/event-stream")
        else:
            body = answer(orjson.dumps(ANSWER))
            extra = answer(b'{"injected": true}')
        writer.write(body + (extra if n == 1 else b""))
        return True  # kept open: a second call must not come on this connection

    with stack(poisoned) as (hostile, proxy):
        for _ in range(2):
            status, _, body = proxy.call(stream)
            assert status == 200
            if stream:
                assert body.endswith(b"data: [DONE]\n\n") and b"injected" not in body
            else:
                assert orjson.loads(body)["choices"][0]["message"]["content"] == "5"
        assert hostile.call_connections == 2  # the poisoned one was not reused
        rows = proxy.rows(2)
        assert [row["status_code"] for row in rows] == [200, 200]


def test_thousands_of_repeated_upstream_headers_are_a_clean_502() -> None:
    """Was: 60,000 repeated headers merged in quadratic time (the whole proxy stalled for 21 s)
    and then relayed."""

    async def flood(writer: asyncio.StreamWriter, n: int) -> bool:
        body = orjson.dumps(ANSWER)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
        writer.write(b"x-dup: 1\r\n" * 60_000)
        writer.write(b"content-length: %d\r\n\r\n%b" % (len(body), body))
        return True

    with stack(flood) as (hostile, proxy):
        status, _, body = proxy.call()
        assert status == 502, body
        (row,) = proxy.rows(1)
        assert (row["status_code"], row["complete"]) == (502, False)
        assert hostile.calls == 1
    # under the bound, repeated headers are still joined, in order
    conn = UpstreamConnection(asyncio.new_event_loop(), 1.0, lambda _: None)
    conn.in_use = True
    conn.parser.feed_data(
        b"HTTP/1.1 200 OK\r\nx-a: 1\r\nX-A: 2\r\nx-b: 3\r\nx-a: 4\r\ncontent-length: 0\r\n\r\n"
    )
    assert conn.headers == {"x-a": "1, 2, 4", "x-b": "3", "content-length": "0"}
    assert conn.complete and conn.status == 200
    conn.loop.close()


@pytest.mark.parametrize("oversize", ["count", "bytes", "endless"])
def test_an_oversize_upstream_head_is_a_clean_502_logged_as_a_failed_call(oversize: str) -> None:
    """Was: an upstream head of any size was read into memory and relayed; one header that never
    ends was read until the read timeout (30 minutes)."""
    if oversize == "count":
        extra = b"".join(b"x-h%d: 1\r\n" % i for i in range(101))
    else:
        extra = b"x-big: " + b"a" * (65 * 1024) + b"\r\n"

    async def big(writer: asyncio.StreamWriter, n: int) -> bool:
        body = orjson.dumps(ANSWER)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
        if oversize == "endless":  # a header value that never ends
            for _ in range(64):
                writer.write(b"x-big: " if _ == 0 else b"a" * 4096)
                await writer.drain()
            await asyncio.Event().wait()  # held open (until the upstream stops)
        writer.write(extra + b"content-length: %d\r\n\r\n%b" % (len(body), body))
        return True

    with stack(big) as (hostile, proxy):
        status, _, body = proxy.call()
        assert status == 502, body
        assert b"upstream" in body
        (row,) = proxy.rows(1)
        assert (row["status_code"], row["complete"]) == (502, False)
        assert hostile.calls == 1


@pytest.mark.parametrize("status", [b"400 Bad Request", b"500 Internal Server Error"])
def test_a_non_json_upstream_error_reaches_the_agent_and_the_call_is_logged(status: bytes) -> None:
    """Was: `decode("replace")` raised LookupError: the agent got a plain 500, no row."""

    async def refuse(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(answer(b"engine says no \xff", status=status, ctype=b"text/plain"))
        return True

    with stack(refuse) as (hostile, proxy):
        code, headers, body = proxy.call()
        assert (code, body) == (int(status[:3]), b"engine says no \xff")
        assert headers[b"content-type"] == b"text/plain"
        (row,) = proxy.rows(1)
        assert row["status_code"] == code and not row["complete"]
        assert row["response"] == {"raw": "engine says no \ufffd"}
        assert hostile.calls == 1


@pytest.mark.parametrize("failure", ["closed", "garbage"])
def test_a_failure_before_the_first_byte_is_sent_upstream_once(failure: str) -> None:
    """Was: every broken exchange was taken for a stale keep-alive connection and sent again,
    even on a new connection. Only one backend: one attempt, one send."""

    async def broken(writer: asyncio.StreamWriter, n: int) -> bool:
        if failure == "garbage":
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        return False

    with stack(broken) as (hostile, proxy):
        status, _, _ = proxy.call()
        assert status == 502
        (row,) = proxy.rows(1)
        assert (row["status_code"], row["complete"]) == (502, False)
        assert hostile.calls == 1
