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

from polar_mq.proxy.server.state import ProxyState
from polar_mq.proxy.store.record import CallContext, call_row

STATUS_CLIENT_GONE = 499


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class HangUpWatch:
    """Cancels the current task when the client hangs up while the call is being served.

    Only the watch is a task of its own (one task per call, no `asyncio.wait` on the hot path).
    After the served part ends — normally, or with a `CancelledError` — `settle()` tells whether
    the client left, and if so takes back the cancellation this watch made (`uncancel`), so that
    only a cancellation from elsewhere (the server shutting down) goes on; `stop()` always.
    """

    __slots__ = ("_task", "_watch", "active", "left")

    def __init__(self, receive: Receive) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self.left = False
        self.active = True
        self._watch = asyncio.ensure_future(_disconnected(receive))
        self._watch.add_done_callback(self._hung_up)

    def _hung_up(self, watch: asyncio.Future[None]) -> None:
        if self.active and not watch.cancelled() and watch.exception() is None:
            self.left = True
            self._task.cancel()

    def settle(self) -> bool:
        """True when the client left (this watch's cancellation is taken back)."""
        if self.left:
            self._task.uncancel()
        return self.left

    def stop(self) -> None:
        """A hang-up seen from now on is no longer this call's business."""
        self.active = False
        self._watch.cancel()


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
    hang_up = HangUpWatch(receive)
    try:
        response = await forward
    except asyncio.CancelledError:
        if not hang_up.settle():
            raise
    else:
        hang_up.settle()  # the answer was ready first (forward swallowed the cancellation)
        return response
    finally:
        hang_up.stop()  # a disconnect seen from now on is the response's business
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
