"""Cut a request whose body does not arrive in time (half-sent bodies, slow-body clients).

uvicorn waits for a request body for as long as the client keeps its connection open, so clients
that send half a body and stall each hold a connection, a task and a partial buffer forever. This
pure ASGI middleware (used by the API and the proxy) gives the whole body a deadline counted from
the start of the request (`body_read_timeout_s`, default 30 s). While the app waits for body bytes
past it, `receive` raises `BodyReadTimeout`, an `HTTPException(408)` so that FastAPI's body reader
lets it through; if nothing was sent yet the middleware answers 408 with `Connection: close`, and
the server closes the connection. Once the body is complete `receive` is passed through untouched:
long polls and streams wait on it for the client's disconnect, without a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CLOSE = {"Connection": "close"}
E = TypeVar("E", bound=Exception)


class BodyReadTimeout(HTTPException):
    """The request body did not arrive within the deadline (raised from `receive`)."""

    def __init__(self, timeout_s: float) -> None:
        message = f"request body not received within {timeout_s:g} s"
        super().__init__(408, message, headers=dict(CLOSE))
        self.message = message


class BodyTimeoutMiddleware:
    """`refuse` renders the 408 in the app's own error shape."""

    def __init__(
        self, app: ASGIApp, timeout_s: float, refuse: Callable[[BodyReadTimeout], Response]
    ) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        body_done = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise BodyReadTimeout(self.timeout_s) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        await refuse_unless_started(
            self.app, scope, receive, send, timed_receive, BodyReadTimeout, self.refuse
        )


async def refuse_unless_started(
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    guarded: Receive,
    error: type[E],
    refuse: Callable[[E], Response],
) -> None:
    """Run `app` reading the body through `guarded`, which raises `error` to cut the request;
    answer with `refuse(error)` if the app had not started its response yet. Once it had, the
    error goes on up and the server closes the connection (the status line is already out).
    The body guards (`BodyTimeoutMiddleware`, `api.body_limit`) share this."""
    started = False

    async def tracking_send(message: Message) -> None:
        nonlocal started
        if message["type"] == "http.response.start":
            started = True
        await send(message)

    try:
        await app(scope, guarded, tracking_send)
    except error as exc:
        if started:
            raise
        await refuse(exc)(scope, receive, send)
