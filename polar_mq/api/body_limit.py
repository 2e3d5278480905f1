"""Refuse oversized request bodies with 413 before they are read whole.

A pure ASGI middleware: a declared Content-Length over the limit is answered at once without
reading a byte of the body; a body sent without one (chunked) is counted while it streams and cut
off as soon as it passes the limit, so a client can never make the API buffer more than the limit.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from polar_mq.api.errors import error_payload
from polar_mq.api.responses import OrjsonResponse
from polar_mq.infra.body_timeout import refuse_unless_started


class PayloadTooLarge(HTTPException):
    """Raised from `receive` mid-body; an HTTPException so FastAPI's body reader lets it through."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds the limit of {limit} bytes")


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._response()(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise PayloadTooLarge(self.max_bytes)
            return message

        await refuse_unless_started(
            self.app, scope, receive, send, counting_receive, PayloadTooLarge, self._response
        )

    def _response(self, _: PayloadTooLarge | None = None) -> Response:
        """The 413 in the API's error shape (the connection closes: the body is left unread)."""
        body = error_payload(
            "payload_too_large", f"request body exceeds the limit of {self.max_bytes} bytes"
        )
        return OrjsonResponse(body, status_code=413, headers={"Connection": "close"})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
