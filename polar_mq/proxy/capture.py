"""Forwarding one call upstream and capturing it: JSON in one piece, streams event by event.

A stream is relayed as it arrives (each upstream read is re-framed, stripped and sent at once)
while token ids, logprobs, finish reason and the time to the first token accumulate. If the agent
disconnects, the upstream request is closed (vLLM then aborts the generation) and the partial call
is still logged, once, with `complete=False` and status 499 (client closed request).

An answered call's row is durable before the agent can have the answer (`CallSink.durable`):
a JSON answer is sent only after, and a stream's end (the read holding `[DONE]` or the family's
final event, or the last bytes of a stream that ended without one) is held back until its row is
recorded and durable. Everything before the end is relayed at once, so the time to the first
token does not change. A proxy killed with -9 then never leaves an agent holding an answer whose
call is not stored. (An agent that hangs up in that last wait leaves a complete row: the engine
did answer in full.) Failures and refusals are not held: the agent did not get an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import httpx
import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from polar_mq.proxy.apis.base import StreamTranslator
from polar_mq.proxy.backends import BackendUnavailable, send_call
from polar_mq.proxy.backends.send import UpstreamResponse
from polar_mq.proxy.errors import bad_gateway
from polar_mq.proxy.server.abort import HangUpWatch
from polar_mq.proxy.server.state import ProxyState
from polar_mq.proxy.sse import SseRelay
from polar_mq.proxy.store.record import CallContext, call_row

logger = logging.getLogger(__name__)

STATUS_CLIENT_GONE = 499
RAW_ERROR_MAX = 4096


def _error_document(raw: bytes) -> dict[str, Any]:
    """An upstream error body as stored JSON (it may not be JSON at all)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        return data
    return {"raw": raw[:RAW_ERROR_MAX].decode("utf-8", "replace")}


def upstream_failed(state: ProxyState, call: CallContext, exc: Exception) -> Response:
    """502 for an upstream we could not reach or that broke off; the call is still logged."""
    logger.warning("upstream %s failed: %r", call.backend, exc)
    message = f"upstream inference server unavailable ({type(exc).__name__})"
    row = call_row(
        call,
        call.backend,
        status_code=502,
        complete=False,
        response={"error": message},
        capture=None,
    )
    state.sink.submit(row)
    state.metrics.observe(row, None)
    return bad_gateway(message)


def _passthrough(
    state: ProxyState, call: CallContext, status: int, raw: bytes, ctype: str
) -> Response:
    """Upstream said no (4xx/5xx): the agent gets exactly that; we log it as an incomplete call."""
    row = call_row(
        call,
        call.backend,
        status_code=status,
        complete=False,
        response=_error_document(raw),
        capture=None,
    )
    state.sink.submit(row)
    state.metrics.observe(row, None)
    return Response(raw, status, headers={"content-type": ctype})


async def forward_json(
    state: ProxyState, call: CallContext, path: str, upstream_body: dict[str, Any]
) -> Response:
    sent = time.perf_counter()
    try:
        upstream = await send_call(state.backends, call, path, upstream_body, read=True)
    except httpx.HTTPError as exc:
        return upstream_failed(state, call, exc)
    except BackendUnavailable as exc:  # paused past the bound, or no backend up: retryable 503
        return state.metrics.refused(call.api_type, exc.response())
    upstream_s = time.perf_counter() - sent
    raw = upstream.content
    ctype = upstream.headers.get("content-type", "application/json")
    if not 200 <= upstream.status_code < 300:
        return _passthrough(state, call, upstream.status_code, raw, ctype)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        return _passthrough(state, call, upstream.status_code, raw, ctype)
    if call.adapt_answer is not None:
        call.adapt_answer(data)
    capture = state.engine.extract_response(call.engine_api, data)
    row = call_row(
        call,
        call.backend,
        status_code=upstream.status_code,
        complete=True,
        response=data if call.stored_response is None else call.stored_response(data),
        capture=capture,
    )
    state.sink.submit(row)
    if call.translated is not None:
        family, translation = call.translated.family, call.translated.translation
        try:
            answer = family.render(data, translation)
        except Exception as exc:  # an engine answer the family cannot express: never a 500
            logger.exception("%s could not render the engine's answer", family.NAME)
            return bad_gateway(f"the engine's answer could not be translated ({exc})")
    else:
        answer = state.engine.visible(data, call.view)
    if call.on_answered is not None:  # TITO: the turn is kept before the agent can go on
        await call.on_answered(capture, data)
    body = orjson.dumps(answer)
    if state.durable_answers:  # the row survives a crash before the agent has the answer
        await state.sink.durable()
    response = Response(body, upstream.status_code, media_type="application/json")
    state.metrics.observe(row, time.perf_counter() - call.started - upstream_s, upstream_s)
    return response


async def forward_stream(
    state: ProxyState, call: CallContext, path: str, upstream_body: dict[str, Any]
) -> Response:
    sent = time.perf_counter()
    try:
        upstream = await send_call(state.backends, call, path, upstream_body, read=False)
    except httpx.HTTPError as exc:
        return upstream_failed(state, call, exc)
    except BackendUnavailable as exc:
        return state.metrics.refused(call.api_type, exc.response())
    if not 200 <= upstream.status_code < 300:
        try:
            raw = await upstream.aread()
        except httpx.HTTPError:
            raw = b""
        finally:
            await upstream.aclose()
        ctype = upstream.headers.get("content-type", "application/json")
        return _passthrough(state, call, upstream.status_code, raw, ctype)
    added_s = sent - call.started  # what the proxy adds before the first byte
    return CapturedStream(state, call, upstream, added_s)


class CapturedStream(Response):
    """An ASGI response that relays an upstream SSE stream and logs the capture exactly once."""

    def __init__(
        self,
        state: ProxyState,
        call: CallContext,
        upstream: UpstreamResponse,
        added_s: float | None = None,
    ) -> None:
        self.status_code = upstream.status_code
        self.background = None
        self._translator: StreamTranslator | None = None
        if call.translated is not None:
            self._translator = call.translated.family.stream(call.translated.translation)
            ctype = self._translator.media_type
        else:
            ctype = upstream.headers.get("content-type", "text/event-stream")
        self.raw_headers = [
            (b"content-type", ctype.encode("latin-1")),
            (b"cache-control", b"no-cache"),
        ]
        self._state = state
        self._call = call
        self._upstream = upstream
        self._capture = state.engine.stream_capture(call.engine_api)
        self._strip = state.engine.strip
        self._added_s = added_s
        if self._translator is None:
            self._relay = SseRelay(self._on_event)
        else:
            self._relay = SseRelay(
                self._on_event, render=self._translator.chunk, on_done=self._translator.done
            )
        self._first_token_at: float | None = None
        self._started = False
        self._ended = False
        self._delivered = False
        """True once the agent was sent the end of the answer (`[DONE]` or the API family's final
        event): an agent that hangs up after that (Codex closes on `response.completed`) got the
        whole call, which stays complete."""
        self._status = upstream.status_code
        """What we record: upstream's status, 499 if the agent left, 502 if upstream broke off."""
        self._recorded = False

    def _on_event(self, chunk: dict[str, Any]) -> None:
        if self._call.adapt_answer is not None:
            self._call.adapt_answer(chunk)
        if self._capture.feed(chunk):
            self._first_token_at = time.perf_counter()
        if self._translator is None:
            self._strip(chunk, self._call.view, False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Relay in this task; a watch task cancels it when the agent hangs up (one task per
        stream and no `asyncio.wait` on the hot path)."""
        hang_up = HangUpWatch(receive)
        cancelled: asyncio.CancelledError | None = None
        try:
            try:
                await self._pump(send)
            except asyncio.CancelledError as exc:
                if not self._delivered:  # after the whole answer, hanging up is normal
                    self._status = STATUS_CLIENT_GONE
                if not hang_up.settle():
                    cancelled = exc  # the server's: clean up, log, then let it through
            except OSError:  # ASGI 2.4 servers raise on send after a disconnect
                if not self._delivered:
                    self._status = STATUS_CLIENT_GONE
            except Exception as exc:
                self._status = 500
                logger.error("stream relay failed", exc_info=exc)
            else:
                hang_up.settle()  # the relay may have ended before the hang-up was delivered
            finally:
                hang_up.stop()
            with contextlib.suppress(httpx.HTTPError):  # hanging up is all we need here
                await self._upstream.aclose()
            if self._started and not self._ended and self._status != STATUS_CLIENT_GONE:
                with contextlib.suppress(Exception):  # end the body after a relay failure
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self._record()
        if cancelled is not None:
            raise cancelled

    async def _pump(self, send: Send) -> None:
        self._started = True
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        try:
            async for raw in self._upstream.aiter_bytes():
                out = self._relay.feed(raw)
                if self._relay.done and not self._recorded:
                    if self._call.on_answered is not None:
                        await self._answered()
                    await self._record_durably()  # before the end reaches the agent
                if out:
                    self._delivered = self._relay.done  # handed over: the agent may leave now
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            tail = self._relay.flush()
            if self._translator is not None and not self._relay.done:
                tail += self._translator.fail("upstream inference server ended the stream early")
        except httpx.HTTPError as exc:
            logger.warning("upstream %s broke off a stream: %r", self._call.backend, exc)
            self._status = 502
            message = "upstream inference server broke off the stream"
            if self._translator is not None:
                tail = self._relay.flush() + self._translator.fail(message)
            else:
                error = {"message": message, "type": "upstream_error", "code": "bad_gateway"}
                tail = self._relay.flush() + b"data: " + orjson.dumps({"error": error}) + b"\n\n"
        if not self._recorded:
            await self._record_durably()
        self._ended = True
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _record_durably(self) -> None:
        self._record()
        if self._state.durable_answers:
            await self._state.sink.durable()

    async def _answered(self) -> None:
        """The hook of a call whose whole answer arrived, once, before the agent gets its end."""
        hook, self._call.on_answered = self._call.on_answered, None
        capture = self._capture
        if hook is not None and capture.finish_reason is not None and capture.error is None:
            await hook(capture.result(), capture.summary())

    def _record(self) -> None:
        """Submit the call's row, once (at the end of the answer, or on the way out)."""
        if self._recorded:
            return
        self._recorded = True
        capture = self._capture
        complete = (
            self._status < 300
            and self._relay.done
            and capture.finish_reason is not None
            and capture.error is None
        )
        summary = capture.summary()
        if self._call.stored_response is not None:
            summary = self._call.stored_response(summary)
        row = call_row(
            self._call,
            self._call.backend,
            status_code=self._status,
            complete=complete,
            response=summary,
            capture=capture.result(),
            first_token_at=self._first_token_at,
        )
        self._state.sink.submit(row)
        self._state.metrics.observe(row, self._added_s)
