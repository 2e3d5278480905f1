"""A backend's keep-alive pool of upstream connections: the proxy's HTTP/1.1 client for the
generate calls it forwards.

Generic clients pay per call for features the proxy does not use (cookies, redirects, proxies,
URL and header objects, per-request timeout objects); what they cost is in docs/benchmarks.md.
This pool keeps idle connections in a dict used as a stack: the most recently used is taken
first (`popitem`, O(1); it is the warmest and the least likely to have been closed by the engine)
and a connection the engine closes while idle leaves it at once (O(1)). It is unbounded: the
backend's `max_in_flight` bounds calls, not sockets. A connection goes back only when its answer
was read to the end; otherwise it is closed.

An `https://` engine is reached over TLS with the process's verifying client context
(`polar_mq.infra.tls`), the one the backend's httpx client uses for its health checks.

Timeouts: 10 s to connect (`httpx.ConnectTimeout`; refused: `httpx.ConnectError`), 1800 s
without a byte while an answer is awaited (`httpx.ReadTimeout`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

import httpx

from polar_mq.infra.tls import client_ssl_context
from polar_mq.proxy.backends.upstream_conn import LeanResponse, StaleConnection, UpstreamConnection

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 1800.0


class UpstreamPool:
    """Connections to one engine (`base_url`), and the requests heads of its forwarded paths."""

    def __init__(
        self,
        base_url: str,
        paths: tuple[str, ...],
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`ssl_context` for an `https://` engine: the process's verifying one unless given."""
        url = httpx.URL(base_url)
        self.host = url.host
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = None
        if url.scheme == "https":
            self.ssl = ssl_context or client_ssl_context()
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._base_url = base_url
        self._host = url.netloc.decode("ascii")
        self.heads = {path: self._head_of(path) for path in paths}
        """Per path, the request up to the content length, built once (other paths on first use:
        the small requests of `Backend.post_small`)."""
        self._idle: dict[UpstreamConnection, None] = {}
        self.opened = 0
        """Connections opened so far (tests and the admin view count reuse with it)."""
        self.closed = False

    def _head_of(self, path: str) -> bytes:
        target = httpx.URL(self._base_url + path).raw_path
        return (
            b"POST " + target + b" HTTP/1.1\r\nhost: " + self._host.encode("ascii") + b"\r\n"
            b"content-type: application/json\r\naccept-encoding: identity\r\n"
            b"content-length: "
        )

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def post(self, path: str, content: bytes, on_close: Callable[[], None]) -> LeanResponse:
        """Send the request and read the status line and headers (the body stays on the socket).

        `on_close` is called when the response is closed, not when this raises. A pooled
        connection that breaks before any byte of the answer raises `StaleConnection`.
        """
        conn = self._take()
        reused = conn is not None
        if conn is None:
            conn = await self._connect()
        head = self.heads.get(path)
        if head is None:
            head = self.heads[path] = self._head_of(path)
        conn.send(head, content)
        try:
            while not conn.head_done:
                error = conn.error
                if error is not None:
                    if reused and not conn.received and _broken(error):
                        raise StaleConnection(str(error)) from error
                    raise error
                await conn.wait()
        except BaseException:
            conn.close()
            raise
        return LeanResponse(conn, self.release, on_close)

    def release(self, conn: UpstreamConnection) -> None:
        """Back to the pool if its answer was read to the end, else closed."""
        if conn.reusable() and not self.closed:
            conn.in_use = False
            self._idle[conn] = None
        else:
            conn.close()

    def _take(self) -> UpstreamConnection | None:
        idle = self._idle
        while idle:
            conn = idle.popitem()[0]
            transport = conn.transport
            if transport is not None and not transport.is_closing():
                return conn
        return None

    def _forget(self, conn: UpstreamConnection) -> None:
        self._idle.pop(conn, None)

    async def _connect(self) -> UpstreamConnection:
        if self.closed:
            raise httpx.ConnectError("the backend was removed")
        loop = asyncio.get_running_loop()
        read_timeout_s, forget = self.read_timeout_s, self._forget

        def protocol() -> UpstreamConnection:
            return UpstreamConnection(loop, read_timeout_s, forget)

        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(protocol, self.host, self.port, ssl=self.ssl),
                self.connect_timeout_s,
            )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"no connection within {self.connect_timeout_s} s") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        self.opened += 1
        return conn

    def close(self) -> None:
        """Close the idle connections; the busy ones close when their answer is released."""
        self.closed = True
        idle, self._idle = self._idle, {}
        for conn in idle:
            conn.close()


def _broken(error: httpx.TransportError) -> bool:
    """The connection closed or reset (not a timeout): what an engine's idle close looks like."""
    return isinstance(error, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError)
