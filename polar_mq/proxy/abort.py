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
    """Run `forward` (which logs its own call) unless the client disconnects first.

    `forward` runs in this task; only the watch is a task of its own, which cancels this one
    when the client leaves (one task per call, no `asyncio.wait`, on the hot path).
    """
    task = asyncio.current_task()
    assert task is not None
    left = False
    forwarding = True

    def hung_up(watch: asyncio.Future[None]) -> None:
        nonlocal left
        if forwarding and not watch.cancelled() and watch.exception() is None:
            left = True
            task.cancel()

    watch = asyncio.ensure_future(_disconnected(receive))
    watch.add_done_callback(hung_up)
    try:
        response = await forward
    except asyncio.CancelledError:
        if not left:
            raise
        task.uncancel()  # our own cancellation, handled here
    else:
        if left:  # the answer was ready first (forward swallowed the cancellation)
            task.uncancel()
        return response
    finally:
        forwarding = False  # a disconnect seen from now on is the response's business
        watch.cancel()
    # The forward coroutine logs its row only after the upstream answered, with no await in
    # between, so cancelling it means the call was not logged: log it here, once.
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
