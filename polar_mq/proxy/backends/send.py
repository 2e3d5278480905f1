"""Sending one call upstream through the pool, retrying elsewhere only before the first byte.

A connect error, a broken exchange or a 5xx before the response started counts against that
backend's breaker and the call is tried on another backend (up to `max_attempts` backends). Once
a response is handed to the relay nothing is retried: the agent may already have bytes of it.
For non-streaming calls the body is read inside the attempt (the agent sees nothing until it is
whole), so a backend dying mid-generation is retried too. A stream that breaks after it started
is not counted against the breaker: the health checks notice an engine that died.

One send per attempt: the only extra send is for `StaleConnection`, a pooled keep-alive
connection that broke before any byte of the answer (the engine had closed it while idle), sent
once more without counting against the backend. A new connection that breaks is the backend's
failure like any other.

The backend's in-flight count covers the call until the upstream response is closed: the
response's byte stream is wrapped so that closing it (which the relay always does) releases it.
The call is stamped with the name and policy version of the backend that served it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import httpx
import orjson

from polar_mq.policy.weights import CHECKPOINT_PREFIX
from polar_mq.proxy.backends.backend import Backend
from polar_mq.proxy.backends.pool import BackendPool, BackendUnavailable
from polar_mq.proxy.backends.upstream_conn import StaleConnection
from polar_mq.proxy.store.record import CallContext

logger = logging.getLogger(__name__)


UPSTREAM_HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}


class UpstreamResponse(Protocol):
    """What the relay reads of an upstream answer: an `upstream_conn.LeanResponse`, or an
    `httpx.Response` when the backend was given a transport (tests)."""

    status_code: int

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content(self) -> bytes: ...

    async def aread(self) -> bytes: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class _LeasedStream(httpx.AsyncByteStream):
    """The upstream byte stream; closing it frees the backend's in-flight slot (once)."""

    __slots__ = ("_backend", "_inner")

    def __init__(self, inner: httpx.AsyncByteStream, backend: Backend) -> None:
        self._inner = inner
        self._backend: Backend | None = backend

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._inner.__aiter__()  # no extra hop per chunk

    async def aclose(self) -> None:
        backend, self._backend = self._backend, None
        try:
            await self._inner.aclose()
        finally:
            if backend is not None:
                backend.release()


async def _attempt(
    pool: BackendPool, backend: Backend, path: str, content: bytes, read: bool
) -> UpstreamResponse:
    """One exchange with `backend`; its in-flight slot is held until the response is closed."""
    upstream = backend.upstream
    if upstream is None:
        return await _attempt_httpx(pool, backend, path, content, read)
    backend.acquire()
    try:
        response: UpstreamResponse = await upstream.post(path, content, backend.release)
    except BaseException:
        backend.release()
        raise
    if read or response.status_code >= 500:
        try:
            await response.aread()
        finally:
            await response.aclose()
    return response


async def _attempt_httpx(
    pool: BackendPool, backend: Backend, path: str, content: bytes, read: bool
) -> httpx.Response:
    """`_attempt` through an injected httpx transport (tests run the fake engine in-process)."""
    request = httpx.Request(
        "POST",
        backend.urls[path],
        content=content,
        headers=UPSTREAM_HEADERS,
        extensions=pool.timeouts,
    )
    backend.acquire()
    try:
        response = await backend.transport.handle_async_request(request)
    except BaseException:
        backend.release()
        raise
    response.request = request
    if response.is_closed:  # a body the transport already loaded (mock transports)
        backend.release()
    else:
        response.stream = _LeasedStream(response.stream, backend)  # type: ignore[arg-type]
    if read or response.status_code >= 500:
        try:
            await response.aread()
        finally:
            await response.aclose()  # releases the slot (a no-op if reading closed it)
    return response


def _with_model(body: dict[str, Any], adapter: str) -> bytes:
    """The body for a backend serving a LoRA adapter: the call runs on the adapter whatever
    model name the agent sent (`polar_mq.proxy.adapters`)."""
    return orjson.dumps({**body, "model": adapter})


async def send_call(
    pool: BackendPool, call: CallContext, path: str, body: dict[str, Any], *, read: bool
) -> UpstreamResponse:
    """POST `body` for `call`; `read` reads the whole body before returning (non-streaming).

    Raises `BackendUnavailable` (a 503 to give the agent) when no backend can take the call, and
    the last `httpx.HTTPError` when every backend tried failed; a last 5xx is returned as is.
    """
    content = orjson.dumps(body)
    tried: tuple[Backend, ...] = ()
    last: UpstreamResponse | httpx.HTTPError | None = None
    stale_retried = False
    for _ in range(pool.max_attempts + 1):
        try:
            backend = await pool.choose(call.rollout_id, tried)
        except BackendUnavailable:
            if last is None:
                raise
            break
        call.backend = backend.name
        call.policy_version = backend.policy_version
        lora = backend.adapter  # a full checkpoint is served under the engine's own name
        if lora is None or lora.startswith(CHECKPOINT_PREFIX):
            sent = content
        else:
            sent = _with_model(body, lora)
        try:
            response = await _attempt(pool, backend, path, sent, read)
        except StaleConnection as exc:
            last = exc
            if not stale_retried:  # a pooled keep-alive connection the engine had closed
                stale_retried = True
                logger.info("backend %s: retrying on a new connection: %r", backend.name, exc)
                continue
        except httpx.TransportError as exc:
            last = exc
        except BaseException:
            backend.breaker.cancel_probe()
            raise
        else:
            if response.status_code < 500:
                backend.breaker.record_success()
                backend.served += 1
                return response
            last = response
        backend.failures += 1
        backend.breaker.record_failure()
        logger.warning("backend %s failed a call before its first byte: %r", backend.name, last)
        tried += (backend,)
    if isinstance(last, httpx.HTTPError):
        raise last
    assert last is not None
    return last
