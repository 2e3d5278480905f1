"""The proxy's own upstream client (`upstream_pool`, `upstream_conn`) against real sockets.

The fake vLLM engine in its own process for the ordinary exchanges (keep-alive reuse, streams,
a stream closed early), and an in-test raw socket server scripted per connection for what an
engine does wrong or unusually: closing a kept-alive connection, closing mid-body, chunked and
until-close bodies, stalling, malformed answers, large and binary bodies.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import httpx
import orjson
import pytest
from backends_support import FakeProcess

from polar_mq.infra.ports import free_port
from polar_mq.infra.tls import client_ssl_context
from polar_mq.proxy.backends.pool import BackendPool
from polar_mq.proxy.backends.send import send_call
from polar_mq.proxy.backends.upstream_conn import READ_HIGH_WATER, LeanResponse, UpstreamConnection
from polar_mq.proxy.backends.upstream_pool import UpstreamPool
from polar_mq.proxy.store.record import CallContext

pytestmark = pytest.mark.anyio

PATH = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "What is 2 + 3?"}]}
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


def ok(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + b"".join(extra)
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body (the client always sends a content length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head, await reader.readexactly(length)


class RawServer:
    """A TCP server whose `handler(reader, writer, n)` scripts the n-th connection (from 0)."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:  # handlers still stalling
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index, self.connections = self.connections, self.connections + 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self.handler(reader, writer, index)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read one request and echo its body back (kept alive)."""
        head, body = await read_request(reader)
        self.requests.append((head, body))
        writer.write(ok(body))
        await writer.drain()


@pytest.fixture(params=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Both event loops: the proxy runs on uvloop, whose transports differ."""
    return ("asyncio", {"use_uvloop": request.param == "uvloop"})


@pytest.fixture(scope="module")
def fake_engine() -> Iterator[FakeProcess]:
    with FakeProcess() as fake:
        yield fake


@pytest.fixture(scope="module")
def slow_engine() -> Iterator[FakeProcess]:
    with FakeProcess(token_delay_ms=20) as fake:
        yield fake


async def post(pool: UpstreamPool, body: bytes, closed: list[int] | None = None) -> Any:
    return await pool.post(PATH, body, lambda: closed.append(1) if closed is not None else None)


async def test_calls_reuse_one_kept_alive_connection_and_streams_arrive_whole(
    fake_engine: FakeProcess,
) -> None:
    pool = UpstreamPool(fake_engine.url, (PATH,))
    closed: list[int] = []
    for _ in range(3):
        response = await post(pool, orjson.dumps(BODY), closed)
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        data = orjson.loads(await response.aread())
        assert data["choices"][0]["message"]["content"]
        await response.aclose()
    assert pool.opened == 1 and pool.idle == 1 and closed == [1, 1, 1]
    response = await post(pool, orjson.dumps({**BODY, "stream": True}))
    reads = [chunk async for chunk in response.aiter_bytes()]
    await response.aclose()
    text = b"".join(reads)
    assert text.startswith(b"data: {") and text.rstrip().endswith(b"data: [DONE]")
    assert pool.opened == 1 and pool.idle == 1  # a stream read to the end: kept too
    pool.close()


async def test_a_stream_closed_before_its_end_closes_its_connection(
    slow_engine: FakeProcess,
) -> None:
    """The engine must see the hang-up (vLLM then aborts the generation); never reused."""
    pool = UpstreamPool(slow_engine.url, (PATH,))
    body = {**BODY, "stream": True, "max_tokens": 64}
    response = await post(pool, orjson.dumps(body))
    async for _ in response.aiter_bytes():
        break
    await response.aclose()
    assert pool.idle == 0
    response = await post(pool, orjson.dumps(BODY))
    assert response.status_code == 200 and await response.aread()
    await response.aclose()
    assert pool.opened == 2 and pool.idle == 1
    pool.close()


async def test_the_request_goes_out_exactly_and_bytes_0_to_255_come_back_intact() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await server.answer(reader, writer)

    payload = bytes(range(256)) * 4
    async with RawServer(echo) as server:
        pool = UpstreamPool(server.url + "/engine", (PATH,))  # a base URL's path is kept
        response = await post(pool, payload)
        assert await response.aread() == payload
        await response.aclose()
        head, body = server.requests[0]
        assert body == payload
        lines = head.split(b"\r\n")
        assert lines[0] == b"POST /engine/v1/chat/completions HTTP/1.1"
        assert f"host: 127.0.0.1:{server.port}".encode() in lines
        assert b"content-length: 1024" in lines and b"accept-encoding: identity" in lines
        long_prompt = bytes(range(256)) * 4096  # 1 MiB: written in pieces, not joined
        response = await post(pool, long_prompt)
        assert await response.aread() == long_prompt and server.requests[1][1] == long_prompt
        await response.aclose()
        assert pool.opened == 1
        pool.close()


async def test_a_10_mb_body_arrives_intact_whole_and_streamed() -> None:
    big = bytes(range(256)) * (10 * 1024 * 1024 // 256)

    async def large(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(ok(big))
        await read_request(reader)  # chunked, in uneven pieces
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for start in range(0, len(big), 999_983):
            piece = big[start : start + 999_983]
            writer.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with RawServer(large) as server:
        pool = UpstreamPool(server.url, (PATH,))
        response = await post(pool, b"{}")
        assert await response.aread() == big
        await response.aclose()
        response = await post(pool, b"{}")
        parts = []
        async for chunk in response.aiter_bytes():
            parts.append(chunk)
            await asyncio.sleep(0)  # a relay that keeps up only now and then
        await response.aclose()
        assert b"".join(parts) == big and len(parts) > 1
        assert pool.opened == 1 and pool.idle == 1
        pool.close()


async def test_chunked_and_until_close_bodies_are_read_to_their_end() -> None:
    async def framing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        if n == 0:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for piece in (b"data: 1\n\n", b"data: 2\n\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                await asyncio.sleep(0.02)
            writer.write(b"0\r\n\r\n")
            await read_request(reader)  # the connection was kept: a second call comes here
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
        await writer.drain()

    async with RawServer(framing) as server:
        pool = UpstreamPool(server.url, (PATH,))
        response = await post(pool, b"{}")
        assert b"".join([c async for c in response.aiter_bytes()]) == b"data: 1\n\ndata: 2\n\n"
        await response.aclose()
        response = await post(pool, b"{}")
        assert await response.aread() == b"until the end"
        await response.aclose()
        response = await post(pool, b"{}")  # not kept: `connection: close`
        assert await response.aread() == b"until the end"
        await response.aclose()
        assert server.connections == 2 and pool.opened == 2
        pool.close()


async def test_an_engine_closing_mid_body_is_an_error_not_a_hang() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        if n == 0:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n" + b"x" * 100)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)

    async with RawServer(cut) as server:
        pool = UpstreamPool(server.url, (PATH,))
        response = await post(pool, b"{}")
        with pytest.raises(httpx.RemoteProtocolError):
            await asyncio.wait_for(response.aread(), 5)
        await response.aclose()
        response = await post(pool, b"{}")
        chunks: list[bytes] = []
        with pytest.raises(httpx.RemoteProtocolError):
            async with asyncio.timeout(5):
                async for chunk in response.aiter_bytes():
                    chunks.append(chunk)
        assert chunks == [b"hello"]  # what came before the break was handed on
        await response.aclose()
        assert pool.idle == 0
        pool.close()


async def test_stalls_refusals_and_garbage_are_the_httpx_errors_send_sorts() -> None:
    async def odd(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        if n == 0:
            await asyncio.sleep(5)  # stalls
        else:
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(1)

    async with RawServer(odd) as server:
        pool = UpstreamPool(server.url, (PATH,), read_timeout_s=0.2)
        with pytest.raises(httpx.ReadTimeout):
            await post(pool, b"{}")
        with pytest.raises(httpx.RemoteProtocolError):
            await asyncio.wait_for(post(pool, b"{}"), 5)
        assert pool.idle == 0
        pool.close()
    refused = UpstreamPool(f"http://127.0.0.1:{free_port()}", (PATH,))
    with pytest.raises(httpx.ConnectError):
        await post(refused, b"{}")


@dataclass
class Call:
    """What `send_call` reads and writes of a call."""

    rollout_id: uuid.UUID
    backend: str = ""
    policy_version: int = 0


async def test_a_kept_alive_connection_the_engine_closed_is_retried_on_a_new_one() -> None:
    """The first connection answers once, then drops the next request unanswered (an engine's
    keep-alive timeout racing the call): the call is sent again, on a new connection, and
    counts as no failure of the backend."""

    async def flaky(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await server.answer(reader, writer)
        if n == 0:
            await read_request(reader)  # dropped
            return
        while True:
            await server.answer(reader, writer)

    async with RawServer(flaky) as server:
        pool = BackendPool((PATH,))
        backend = pool.add(server.url)
        call = cast(CallContext, Call(uuid.uuid4()))
        for _ in range(3):
            response = await send_call(pool, call, PATH, BODY, read=True)
            assert orjson.loads(response.content) == BODY
        assert server.connections == 2 and len(server.requests) == 3
        assert backend.failures == 0 and backend.in_flight == 0
        assert call.backend == backend.name
        stream = await send_call(pool, call, PATH, BODY, read=False)  # idle: not in flight
        assert backend.in_flight == 1
        await stream.aclose()
        assert backend.in_flight == 0
        await pool.aclose()


async def test_small_requests_on_a_calls_path_share_the_own_kept_alive_pool() -> None:
    """`/tokenize` (TITO, retokenizing, token counts) goes through the pool the generate calls
    use, not the httpx client: one connection for both, kept alive, the whole answer read."""

    async def answering(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await keep_answering(server, reader, writer)

    async with RawServer(answering) as server:
        pool = BackendPool((PATH,))
        backend = pool.add(server.url)
        for n in range(3):
            answer = await backend.post_small("/tokenize", b'{"n": %d}' % n)
            assert (answer.status_code, answer.content) == (200, b'{"n": %d}' % n)
            assert answer.content_type == "application/json"
        await send_call(pool, cast(CallContext, Call(uuid.uuid4())), PATH, BODY, read=True)
        assert [head.split(b"\r\n")[0] for head, _ in server.requests] == [
            *[b"POST /tokenize HTTP/1.1"] * 3,
            f"POST {PATH} HTTP/1.1".encode(),
        ]
        assert server.connections == 1
        assert backend.upstream is not None and backend.upstream.opened == 1
        await pool.aclose()


async def test_a_small_request_on_a_connection_the_engine_closed_is_sent_again() -> None:
    async def flaky(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await server.answer(reader, writer)
        if n == 0:
            await read_request(reader)  # dropped
            return
        await keep_answering(server, reader, writer)

    async with RawServer(flaky) as server:
        pool = BackendPool((PATH,))
        backend = pool.add(server.url)
        answers = [await backend.post_small("/tokenize", b"{}") for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert server.connections == 2 and len(server.requests) == 3
        await pool.aclose()


async def test_a_small_request_to_an_engine_that_is_down_raises_an_httpx_error() -> None:
    """Its callers catch `httpx.HTTPError` (and fall back, or answer 502)."""
    pool = BackendPool((PATH,))
    backend = pool.add(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(httpx.ConnectError):
        await backend.post_small("/tokenize", b"{}")
    await pool.aclose()


async def keep_answering(
    server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    while True:
        await server.answer(reader, writer)


OPENSSL_SELF_SIGNED = (
    *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
    *("-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
)


@dataclass(frozen=True)
class Tls:
    """A self-signed certificate for 127.0.0.1: the engine's context, and a client's trusting it."""

    server: ssl.SSLContext
    client: ssl.SSLContext


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [*OPENSSL_SELF_SIGNED, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    return Tls(server, ssl.create_default_context(cafile=str(cert)))


async def test_an_https_engine_is_reached_through_the_same_pool_over_verified_tls(tls: Tls) -> None:
    """An `https://` engine's calls go through the own pool too (kept alive over TLS), with the
    process's verifying context by default: an engine whose certificate it does not trust is a
    connect error, and nothing is sent to it."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await server.answer(reader, writer)

    async with RawServer(echo, tls.server) as server:
        assert server.url.startswith("https://")
        pool = UpstreamPool(server.url, (PATH,), ssl_context=tls.client)
        for _ in range(2):
            response = await post(pool, orjson.dumps(BODY))
            assert orjson.loads(await response.aread()) == BODY
            await response.aclose()
        assert pool.opened == 1 and server.connections == 1
        pool.close()
        backend = BackendPool((PATH,)).add(server.url)
        assert backend.upstream is not None and backend.upstream.ssl is client_ssl_context()
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await post(backend.upstream, orjson.dumps(BODY))
        await backend.aclose()
        assert len(server.requests) == 2


class RecordingTransport:
    """Just what `UpstreamConnection` calls on its transport, recorded."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.paused = False
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


async def test_a_stream_ending_over_the_high_water_does_not_leave_its_connection_paused() -> None:
    """Reading pauses while a slow relay leaves more than `READ_HIGH_WATER` unread; when that
    read also ended the answer and the relay closed it unread, the connection is pooled and
    must read again for its next call (else that call waits out the read timeout)."""
    pool = UpstreamPool("http://127.0.0.1:1", (PATH,))
    conn = UpstreamConnection(asyncio.get_running_loop(), 1800.0, lambda _: None)
    transport = RecordingTransport()
    conn.connection_made(cast(asyncio.Transport, transport))
    conn.send(pool.heads[PATH], b"{}")
    conn.data_received(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (READ_HIGH_WATER + 1))
    response = LeanResponse(conn, pool.release, lambda: None)
    conn.streaming = True  # as `aiter_bytes` sets it
    conn.data_received(b"x" * (READ_HIGH_WATER + 1))
    assert conn.complete and transport.paused
    await response.aclose()
    assert pool.idle == 1
    conn.send(pool.heads[PATH], b"{}")
    assert not transport.paused and transport.written[-1].endswith(b"\r\n\r\n{}")
