"""Abort a non-streaming call whose agent hung up, instead of generating for nobody.

A non-streaming request sends nothing until the whole answer is ready, so a client that gives up
(its own timeout, a killed agent) would otherwise keep the engine generating, possibly for minutes
of GPU time, and the call would be logged as if the agent had seen it. While the upstream call is
pending the proxy also listens for the client's disconnect; if that comes first, the upstream
request is cancelled (closing its connection, which makes vLLM/SGLang abort the generation) and
the call is logged once, `complete=False` with status 499, like an abandoned stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from starlette.responses import Response
from starlette.types import Receive

from polar_mq.proxy.record import CallContext, call_row
from polar_mq.proxy.state import ProxyState

STATUS_CLIENT_GONE = 499


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(
    state: ProxyState,
    call: CallContext,
    receive: Receive,
    forward: Coroutine[Any, Any, Response],
) -> Response:
    """Run `forward` (which logs its own call) unless the client disconnects first."""
    work = asyncio.ensure_future(forward)
    watch = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if work.done():
        return work.result()
    # The forward coroutine logs its row only after the upstream answered, with no await in
    # between, so cancelling it now means the call was not logged: log it here, once.
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    row = call_row(
        call,
        call.backend,
        status_code=STATUS_CLIENT_GONE,
        complete=False,
        response={"error": "client closed the request before the answer was ready"},
        capture=None,
    )
    state.sink.submit(row)
    state.metrics.observe(row, None)
    return Response(status_code=STATUS_CLIENT_GONE)
