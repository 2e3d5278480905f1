"""Call logging off the request path: the request only enqueues a dict; a thread writes batches.

`DbCallWriter` keeps a bounded queue (a full queue drops and counts, it never blocks a request), and
one background thread with its own engine turns up to `batch_size` rows, or whatever arrived within
`flush_interval_s`, into one multi-row `INSERT ... ON CONFLICT (id) DO NOTHING` (`call_insert`; the
conflict clause makes a replayed batch idempotent). A database outage is
retried with exponential backoff until it ends (or the writer is closing); a row the database
refuses is isolated and counted as failed, so one bad row never blocks the others.
Later: spill to a local durable buffer while the database is down (SPEC §4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from typing import Any, Protocol, cast

import orjson
from sqlalchemy import Engine
from sqlalchemy.exc import InterfaceError, OperationalError
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential_jitter

from polar_mq.config import Settings
from polar_mq.db import create_db_engine
from polar_mq.proxy.call_insert import CallInserter

logger = logging.getLogger(__name__)

TRANSIENT = (OperationalError, InterfaceError)
_WAKE = object()
_STOP = object()
_Waiter = tuple[int, asyncio.AbstractEventLoop, "asyncio.Future[None]"]
"""A flush() waiting for the writer to have processed that many rows."""


class CallSink(Protocol):
    """Where the proxy puts call rows. `submit` runs on the event loop and must never block."""

    async def start(self) -> None: ...

    def submit(self, row: dict[str, Any]) -> None: ...

    async def flush(self) -> int:
        """Wait until every row submitted before this call is stored; return rows written."""
        ...

    async def close(self) -> None: ...

    def stats(self) -> dict[str, int]: ...


class MemoryCallSink:
    """Keeps rows in a list: for tests and for benchmarks that leave the database out."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    async def start(self) -> None:
        return None

    def submit(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    async def flush(self) -> int:
        return len(self.rows)

    async def close(self) -> None:
        return None

    def stats(self) -> dict[str, int]:
        return {"written": len(self.rows), "dropped": 0, "failed": 0, "pending": 0}


class DbCallWriter:
    """Bounded asynchronous batch writer of `llm_calls` rows (see the module docstring)."""

    def __init__(
        self,
        database_url: str | None = None,
        *,
        engine: Engine | None = None,
        batch_size: int = 256,
        flush_interval_s: float = 0.05,
        queue_max: int = 100_000,
        retry_max_wait_s: float = 5.0,
        close_timeout_s: float = 10.0,
    ) -> None:
        if (database_url is None) == (engine is None):
            raise ValueError("give exactly one of database_url or engine")
        self._url = database_url
        self._engine = engine
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self._retry_max_wait = retry_max_wait_s
        self._close_timeout = close_timeout_s
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_max)
        self._lock = threading.Lock()
        self._waiters: list[_Waiter] = []
        self._thread: threading.Thread | None = None
        self._closing = False
        self._give_up_at: float | None = None
        self._submitted = 0
        self._done = 0
        self._written = 0
        self._dropped = 0
        self._failed = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> DbCallWriter:
        return cls(
            settings.database_url,
            batch_size=settings.log_batch_size,
            flush_interval_s=settings.log_flush_interval_s,
            queue_max=settings.log_queue_max,
        )

    async def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="call-writer", daemon=True)
            self._thread.start()

    def submit(self, row: dict[str, Any]) -> None:
        if self._closing:
            self._dropped += 1
            return
        try:
            self._queue.put_nowait(row)
        except queue.Full:
            self._dropped += 1
            if self._dropped & (self._dropped - 1) == 0:  # log at 1, 2, 4, 8, ... drops
                logger.error("call log queue full: %d calls dropped so far", self._dropped)
            return
        self._submitted += 1

    async def flush(self) -> int:
        target = self._submitted
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._done >= target:
                return self._written
            self._waiters.append((target, loop, future))
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the call writer is not running")
        self._poke()
        await future
        return self._written

    async def close(self) -> None:
        """Write what is queued (giving up on an unreachable database after `close_timeout_s`)."""
        if self._closing:
            return
        self._closing = True
        self._give_up_at = time.monotonic() + self._close_timeout
        thread = self._thread
        if thread is None:
            return
        await asyncio.to_thread(self._queue.put, _STOP)
        await asyncio.to_thread(thread.join, self._close_timeout + self._retry_max_wait + 1.0)
        if thread.is_alive():
            logger.error("call writer did not stop in time; %d rows pending", self.pending)

    @property
    def pending(self) -> int:
        return self._submitted - self._done

    def stats(self) -> dict[str, int]:
        return {
            "written": self._written,
            "dropped": self._dropped,
            "failed": self._failed,
            "pending": self.pending,
        }

    def _poke(self) -> None:
        """Cut the current batch's wait short so a flush does not wait for the interval."""
        with contextlib.suppress(queue.Full):  # a full queue makes full batches: no wait
            self._queue.put_nowait(_WAKE)

    # --- writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        engine: Engine | None = None
        try:
            engine = self._engine or create_db_engine(
                cast(str, self._url),
                pool_size=1,
                max_overflow=0,
                json_serializer=lambda obj: orjson.dumps(obj).decode(),
            )
            inserter = CallInserter(engine)
            stop = False
            while not stop:
                batch, stop = self._collect()
                if batch:
                    self._write(engine, inserter, batch)
                self._mark_done(len(batch))
        except BaseException:  # pragma: no cover - a bug here must not hang flush() forever
            logger.exception("call writer thread crashed")
            raise
        finally:
            if engine is not None and self._engine is None:
                engine.dispose()
            self._mark_done(0, release_all=True)

    def _collect(self) -> tuple[list[dict[str, Any]], bool]:
        """The next batch, and whether the writer was asked to stop after it."""
        batch: list[dict[str, Any]] = []
        item = self._queue.get()
        deadline: float | None = None
        while True:
            if item is _STOP:
                return batch, True
            if item is _WAKE:
                return batch, False
            batch.append(item)
            if len(batch) >= self._batch_size:
                return batch, False
            try:
                item = self._queue.get_nowait()
                continue
            except queue.Empty:
                pass
            if deadline is None:
                deadline = time.monotonic() + self._interval
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return batch, False
            try:
                item = self._queue.get(timeout=remaining)
            except queue.Empty:
                return batch, False

    def _write(self, engine: Engine, inserter: CallInserter, rows: list[dict[str, Any]]) -> None:
        retrying = Retrying(
            retry=retry_if_exception_type(TRANSIENT),
            wait=wait_exponential_jitter(initial=0.05, max=self._retry_max_wait),
            stop=self._should_give_up,
            before_sleep=_log_retry,
            reraise=True,
        )
        try:
            retrying(_insert, engine, inserter, rows)
        except TRANSIENT:
            self._failed += len(rows)
            logger.error("database unreachable while closing: %d call rows lost", len(rows))
            return
        except Exception:
            if len(rows) > 1:  # isolate the row(s) the database refuses
                for row in rows:
                    self._write(engine, inserter, [row])
                return
            self._failed += 1
            logger.exception("call row %s refused by the database; dropped", rows[0].get("id"))
            return
        self._written += len(rows)

    def _should_give_up(self, state: RetryCallState) -> bool:
        return self._give_up_at is not None and time.monotonic() >= self._give_up_at

    def _mark_done(self, n: int, release_all: bool = False) -> None:
        with self._lock:
            self._done += n
            done = self._done
            ready: list[_Waiter] = []
            waiting: list[_Waiter] = []
            for waiter in self._waiters:
                (ready if release_all or waiter[0] <= done else waiting).append(waiter)
            self._waiters = waiting
        for _, loop, future in ready:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, future)


def _insert(engine: Engine, inserter: CallInserter, rows: list[dict[str, Any]]) -> None:
    with engine.begin() as conn:
        inserter.insert(conn, rows)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    logger.warning("call log write failed (attempt %d), retrying: %s", state.attempt_number, exc)
