"""The fallback upstream client (`POLAR_MQ_PROXY_UPSTREAM_CLIENT=aiohttp`): one aiohttp session
(keep-alive pool) per backend. The default is the proxy's own pool (`upstream_pool`), which costs
about a third less CPU per call (`bench.proxy.hot`).

httpx/httpcore cost the proxy most of its CPU per call (its pool walks every connection on each
request and close; `bench/proxy`), aiohttp's connector takes a pooled connection in O(1) and
parses responses in C. Only the forwarded generate calls use it; health checks, `/tokenize` and
`/v1/models` keep the backend's httpx client (rare calls, and tests inject an httpx transport,
in which case the hot path uses that transport instead).

`AioResponse` presents an aiohttp response with the part of `httpx.Response`'s interface the
relay uses (`status_code`, `headers`, `content`, `aread`, `aiter_bytes`, `aclose`), and turns
aiohttp's errors into the `httpx` errors `send` and `capture` already sort: a closed connection
(`ServerDisconnectedError`, a reset) becomes `httpx.RemoteProtocolError`/`httpx.ReadError`, a
refused connection `httpx.ConnectError`, a read timeout `httpx.ReadTimeout`. aiohttp does not say
whether a broken connection was a pooled one, so none is taken for a stale keep-alive connection
(`upstream_conn.StaleConnection`): each is a failure of the backend, sent no second time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import httpx
from multidict import CIMultiDictProxy
from yarl import URL

from polar_mq.proxy.backends.upstream_conn import MAX_HEADERS

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 1800.0
"""As the httpx client's: a generous read timeout for long generations, no pool timeout."""
HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}


def new_session() -> aiohttp.ClientSession:
    """An unbounded keep-alive pool (the backend's `max_in_flight` bounds calls, not sockets).

    An answer's head is bounded as the own pool bounds it: `MAX_HEADERS` headers (aiohttp's
    default is 128), each within aiohttp's 8 KiB field size."""
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=False)
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
        trust_env=False,
        max_headers=MAX_HEADERS,
    )


def as_httpx_error(exc: BaseException) -> httpx.TransportError:
    """The httpx error `send`/`capture` handle for an aiohttp (or socket) failure."""
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(message)
    if isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        return httpx.ReadTimeout(message)
    if isinstance(exc, aiohttp.ClientResponseError):
        return httpx.RemoteProtocolError(message)
    return httpx.ReadError(message)  # ClientOSError (reset, broken pipe) and the rest


TRANSPORT_ERRORS = (aiohttp.ClientError, OSError, asyncio.TimeoutError)


class AioResponse:
    """An upstream response; `aclose` frees the connection and calls `on_close` (once)."""

    __slots__ = ("_on_close", "_response", "content", "headers", "status_code")

    def __init__(self, response: aiohttp.ClientResponse, on_close: Callable[[], None]) -> None:
        self._response = response
        self._on_close: Callable[[], None] | None = on_close
        self.status_code = response.status
        self.headers: CIMultiDictProxy[str] = response.headers
        self.content = b""

    async def aread(self) -> bytes:
        try:
            self.content = await self._response.read()
        except TRANSPORT_ERRORS as exc:
            raise as_httpx_error(exc) from exc
        return self.content

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        stream = self._response.content
        try:
            while True:
                chunk = await stream.readany()
                if not chunk:
                    return
                yield chunk
        except TRANSPORT_ERRORS as exc:
            raise as_httpx_error(exc) from exc

    async def aclose(self) -> None:
        """Back to the pool when read to the end; closed otherwise (vLLM aborts the request)."""
        response = self._response
        if response.content.at_eof():
            response.release()
        else:
            response.close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()


async def post(
    session: aiohttp.ClientSession, url: URL, content: bytes, on_close: Callable[[], None]
) -> AioResponse:
    """Send the request and read the status line and headers (the body stays on the socket)."""
    try:
        response: Any = await session.post(url, data=content, headers=HEADERS)
    except TRANSPORT_ERRORS as exc:
        raise as_httpx_error(exc) from exc
    return AioResponse(response, on_close)
