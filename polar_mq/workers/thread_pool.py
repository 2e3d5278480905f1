"""Celery's thread pool, with each task's completion callback run on the consumer's own thread.

Why: with late acknowledgement, Celery's `threads` pool acknowledges a message from the pool
thread that ran the task, on the consumer's broker connection. py-amqp's connection is not
thread-safe (its reads change the socket's timeout, its writes are not serialised): after a
RabbitMQ restart, under load, acknowledgements sent from pool threads were lost, the prefetch
window filled up with messages already done, and the node received nothing more until the broker
dropped the connection minutes later (`tests/reliability/test_broker_faults.py`). Here a pool
thread only queues the callback (the ack, or the reject of a failed task) and wakes the
consumer's event loop through a pipe; the loop runs it, on the thread that owns the connection.

`install_as_threads` makes it what `-P threads` means for workers of polar_mq's app
(`workers.entry`), so `polar-mq worker` and a hand-written `celery -A polar_mq.workers.entry
worker -P threads` both get it. Without an event loop (a transport Celery drives synchronously)
the callbacks run where they did before.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable
from typing import Any

from celery import concurrency
from celery.concurrency import thread

Callback = Callable[..., Any]


POOL_PATH = f"{__name__}:TaskPool"


def install_as_threads() -> None:
    """Make Celery's `threads` pool name resolve to this pool, in this process.

    Celery resolves `-P NAME` through `celery.concurrency.ALIASES` after it has loaded the app
    module; its own hook for an out-of-tree pool (`-P custom` with `CELERY_CUSTOM_WORKER_POOL`)
    is read when `celery.concurrency` is first imported, which the stage workers' fork server
    does long before any worker's environment is known."""
    concurrency.ALIASES["threads"] = POOL_PATH


class TaskPool(thread.TaskPool):  # type: ignore[misc]  # celery is untyped
    """`celery.concurrency.thread.TaskPool` whose completion callbacks run on the event loop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ready: deque[tuple[Callback, tuple[Any, ...]]] = deque()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._hub: Any = None
        self._closed = False

    def register_with_event_loop(self, loop: Any) -> None:
        self._hub = loop
        loop.add_reader(self._wake_read, self._run_ready)

    def on_apply(
        self,
        target: Callback,
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        callback: Callback | None = None,
        accept_callback: Callback | None = None,
        **options: Any,
    ) -> Any:
        if callback is not None and self._hub is not None:
            callback = _Deferred(self, callback)
        return super().on_apply(target, args, kwargs, callback, accept_callback, **options)

    def defer(self, callback: Callback, args: tuple[Any, ...]) -> None:
        """From a pool thread: queue `callback(*args)` for the loop and wake it."""
        self._ready.append((callback, args))
        with contextlib.suppress(BlockingIOError):  # a full pipe: the loop is due to wake anyway
            os.write(self._wake_write, b"\0")

    def _run_ready(self) -> None:
        """On the loop's thread: empty the wake-up pipe, then run every queued callback."""
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._wake_read, 4096):
                pass
        while self._ready:
            callback, args = self._ready.popleft()
            callback(*args)

    def on_stop(self) -> None:
        super().on_stop()  # waits for the running tasks
        self._run_ready()  # the loop has stopped: what they queued runs here, not lost
        if self._closed:
            return
        self._closed = True
        if self._hub is not None:
            with contextlib.suppress(Exception):
                self._hub.remove_reader(self._wake_read)
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)


class _Deferred:
    """A completion callback that a pool thread hands to the loop instead of running it."""

    __slots__ = ("callback", "pool")

    def __init__(self, pool: TaskPool, callback: Callback) -> None:
        self.pool = pool
        self.callback = callback

    def __call__(self, *args: Any) -> None:
        self.pool.defer(self.callback, args)
