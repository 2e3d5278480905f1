"""An in-process httpx transport that streams an ASGI app's response as the app sends it.

`httpx.ASGITransport` runs the app to completion and hands back the whole body, so an in-process
test can neither see chunks arrive one by one nor hang up early. This transport runs the app in a
task, yields each body message as it is sent, and on `aclose()` before the end tells the app the
client disconnected (`http.disconnect`), as a server would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.types import ASGIApp, Message

_END: Message = {"type": "polar_mq.end"}


class StreamingASGITransport(httpx.AsyncBaseTransport):
    def __init__(self, app: ASGIApp, close_timeout_s: float = 5.0) -> None:
        self.app = app
        self.close_timeout_s = close_timeout_s

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        queue: asyncio.Queue[Message] = asyncio.Queue()
        disconnected = asyncio.Event()
        body_sent = False

        async def receive() -> Message:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if not disconnected.is_set():
                await queue.put(message)

        async def run() -> None:
            try:
                await self.app(_scope(request), receive, send)
            finally:
                await queue.put(_END)

        task = asyncio.create_task(run())
        try:
            start = await queue.get()
        except asyncio.CancelledError:
            # The caller gave up before the response started: hang up, and cancel the app the way
            # vLLM's API server cancels a request handler whose client disconnected.
            # Like closing a socket, this takes effect before the caller goes on: the app has
            # seen its cancellation when this returns.
            disconnected.set()
            task.cancel()
            await asyncio.wait((task,), timeout=self.close_timeout_s)
            raise
        if start["type"] != "http.response.start":
            await task  # raises the app's exception, if any
            raise RuntimeError("the ASGI app ended without a response")
        stream = _BodyStream(queue, task, disconnected, self.close_timeout_s)
        return httpx.Response(start["status"], headers=start.get("headers", []), stream=stream)


def _scope(request: httpx.Request) -> dict[str, Any]:
    url = request.url
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": url.scheme,
        "path": url.path,
        "raw_path": url.raw_path.split(b"?")[0],
        "query_string": url.query,
        "root_path": "",
        "headers": [(k.lower(), v) for k, v in request.headers.raw],
        "client": ("127.0.0.1", 123),
        "server": (url.host, url.port or 80),
    }


class _BodyStream(httpx.AsyncByteStream):
    def __init__(
        self,
        queue: asyncio.Queue[Message],
        task: asyncio.Task[None],
        disconnected: asyncio.Event,
        close_timeout_s: float,
    ) -> None:
        self._queue = queue
        self._task = task
        self._disconnected = disconnected
        self._close_timeout_s = close_timeout_s

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            message = await self._queue.get()
            if message is _END:
                return
            if message["type"] == "http.response.body":
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body", False):
                    return

    async def aclose(self) -> None:
        """Hang up: the app sees `http.disconnect`; wait for it to wind down (cancel if slow)."""
        self._disconnected.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), self._close_timeout_s)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
