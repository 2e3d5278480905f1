"""Reading the agent's JSON body with a size limit and a deadline, before anything is forwarded.

The deadline is `body_read_timeout_s` from the start of the read (as
`polar_mq.infra.body_timeout`'s, which the generate routes bypass: they are served by `fast_path`
without Starlette's middleware, so the deadline is kept here, one `asyncio.timeout_at` around the
read instead of a timed `receive` per message): a body that stalls is a 408 and the connection is
closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from polar_mq.infra.body_timeout import BodyReadTimeout
from polar_mq.proxy.errors import bad_request, request_timeout, too_large


async def read_json_object(
    request: Request, limit: int, timeout_s: float | None = None
) -> dict[str, Any] | Response:
    """The body as a dict, or the error response to send (413 oversized, 400 malformed).

    A declared Content-Length over the limit is refused before a byte of the body is read; a
    chunked or lying body is counted while reading and refused as soon as it passes the limit.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                return too_large(limit)
        except ValueError:
            return bad_request("invalid Content-Length header")
    chunks: list[bytes] = []
    size = 0
    deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
    try:
        async with asyncio.timeout_at(deadline):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    return too_large(limit)
                chunks.append(chunk)
    except BodyReadTimeout as exc:  # answered here, so each API family re-shapes it
        return request_timeout(exc.message)
    except TimeoutError:
        assert timeout_s is not None
        return request_timeout(BodyReadTimeout(timeout_s).message)
    try:
        body = orjson.loads(chunks[0] if len(chunks) == 1 else b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        return bad_request(f"request body is not valid JSON: {exc}", "invalid_json")
    if not isinstance(body, dict):
        return bad_request("request body must be a JSON object", "invalid_json")
    return body
