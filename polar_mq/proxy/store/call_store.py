"""Where a batch of call rows goes, on the writer thread: the database, or the spill buffer.

Kept apart from `writer` (which owns the queue, the thread and flush) so the outage logic reads
alone. With a `SpillBuffer`:

- A batch is inserted with short retries (`spill_after_s`); if the database stays unreachable the
  batch is appended to the spill buffer and the store is *down*: later batches go straight to
  the buffer (no request ever waits on the database) until the next probe, which backs off
  exponentially up to `retry_max_wait_s`.
- `replay()` moves the oldest spilled segment into the database, one transaction per
  `batch_size` rows, and deletes the segment only after all its rows are committed; the
  statement's `ON CONFLICT (id) DO NOTHING` makes a segment replayed twice (crash between commit
  and delete, or a commit whose reply was lost) land exactly once.

Without a spill buffer the store retries in place until the database is back or the writer is
closing (the queue in front of it absorbs the outage until it is full).
A row the database refuses (not a connection problem) is isolated, so one bad row never blocks its
batch or a replay; it is counted (`refused`, exported as `polar_proxy_rows_refused_total`), logged
as an error naming its rollout, and kept in the spill directory's `refused/` file (see `spill`),
never silently dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import InterfaceError, OperationalError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from polar_mq.proxy.store.call_insert import CallInserter
from polar_mq.proxy.store.spill import SpillBuffer

logger = logging.getLogger(__name__)

TRANSIENT = (OperationalError, InterfaceError)
PROBE_MIN_S = 0.1
"""First wait before probing a database that just failed; doubles up to `retry_max_wait_s`."""


class CallStore:
    """Stores batches in the database or, while it is unreachable, in the spill buffer."""

    def __init__(
        self,
        engine: Engine,
        spill: SpillBuffer | None,
        *,
        batch_size: int,
        retry_max_wait_s: float,
        spill_after_s: float,
        closing: Callable[[], bool],
        committed: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        self._engine = engine
        self._inserter = CallInserter(engine)
        self.spill = spill
        self._batch_size = batch_size
        self._retry_max_wait = retry_max_wait_s
        self._spill_after = spill_after_s
        self._closing = closing
        self._committed = committed
        """Told of every batch just after its commit (the call receipts), never of a refused row."""
        self._next_probe = 0.0
        self._probe_wait = PROBE_MIN_S
        self.written = 0
        self.replayed = 0
        self.failed = 0
        self.refused = 0

    @property
    def backlog(self) -> int:
        """Rows in the spill buffer, not yet in the database."""
        return self.spill.rows if self.spill is not None else 0

    def wait_hint(self) -> float | None:
        """How long the writer may block on an empty queue: None = until rows arrive."""
        if self.spill is None or self.spill.empty:
            return None
        return max(0.0, self._next_probe - time.monotonic())

    def store(self, rows: list[dict[str, Any]]) -> None:
        if self.spill is None:
            self._store_retrying(rows)
            return
        if self._down():
            self.spill.append(rows)
            return
        # A database that was down gets one attempt per probe; a healthy one a few retries.
        stop = stop_after_attempt(1) if self._next_probe else stop_after_delay(self._spill_after)
        try:
            self.written += self._retrying(stop)(self._commit, rows)
        except TRANSIENT as exc:
            self._mark_down(exc)
            self.spill.append(rows)
            return
        self._mark_up()

    @property
    def down(self) -> bool:
        """The database failed and is not due for its next probe: rows go to the spill buffer."""
        return self._down()

    def commit_journaled(self, rows: list[dict[str, Any]]) -> bool:
        """Commit rows that are durable in the answer journal already (`journal`), in batches of
        `batch_size`; False if the database is unreachable (the caller makes them spill
        backlog). One attempt, no retry: nothing waits on it, the rows are safe on disk."""
        try:
            committed = self._commit_in_batches(rows)
        except TRANSIENT as exc:  # all of them are replayed from the spill (idempotent)
            self._mark_down(exc)
            return False
        self.written += committed
        self._mark_up()
        return True

    def replay(self) -> bool:
        """Move the oldest spilled segment into the database; True if one was replayed."""
        if self.spill is None or self.spill.empty or self._down():
            return False
        read = self.spill.oldest()
        if read is None:
            return False
        try:
            committed = self._commit_in_batches(read.rows)
        except TRANSIENT as exc:  # the whole segment is replayed again later (idempotent)
            self._mark_down(exc)
            return False
        self.spill.remove(read)
        self.written += committed
        self.replayed += len(read.rows)
        self._mark_up()
        logger.info("replayed %d spilled call rows (%d left)", len(read.rows), self.spill.rows)
        return True

    # --- internals -----------------------------------------------------------------------------

    def _commit_in_batches(self, rows: list[dict[str, Any]]) -> int:
        """Commit `rows`, `batch_size` per statement; how many were committed. An outage is
        raised: the caller keeps every row for a later try (those committed land once)."""
        committed = 0
        for start in range(0, len(rows), self._batch_size):
            committed += self._commit(rows[start : start + self._batch_size])
        return committed

    def _store_retrying(self, rows: list[dict[str, Any]]) -> None:
        try:
            self.written += self._retrying(self._give_up)(self._commit, rows)
        except TRANSIENT:
            self.failed += len(rows)
            logger.error("database unreachable while closing: %d call rows lost", len(rows))

    def _retrying(self, stop: Any) -> Retrying:
        return Retrying(
            retry=retry_if_exception_type(TRANSIENT),
            wait=wait_exponential_jitter(initial=0.05, max=self._retry_max_wait),
            stop=stop,
            before_sleep=_log_retry,
            reraise=True,
        )

    def _give_up(self, state: RetryCallState) -> bool:
        return self._closing()

    def _commit(self, rows: list[dict[str, Any]]) -> int:
        """Insert and commit `rows`; returns how many were committed. Refused rows are isolated
        and counted as failed; an outage is raised."""
        try:
            with self._engine.begin() as conn:
                self._inserter.insert(conn, rows)
        except TRANSIENT:
            raise
        except Exception as exc:
            if len(rows) > 1:
                return sum(self._commit([row]) for row in rows)
            self._refuse(rows[0], exc)
            return 0
        if self._committed is not None:
            self._committed(rows)
        return len(rows)

    def _refuse(self, row: dict[str, Any], exc: Exception) -> None:
        """Count, log and keep a row the database will not take (it would be refused again)."""
        self.failed += 1
        self.refused += 1
        kept = self.spill.keep_refused(row) if self.spill is not None else None
        logger.error(
            "call row %s (rollout %s, attempt %s, seq %s) refused by the database: %s; %s",
            row.get("id"),
            row.get("rollout_id"),
            row.get("attempt"),
            row.get("seq"),
            _short(exc),
            f"kept in {kept}" if kept else "NOT kept (no spill directory)",
        )

    def _down(self) -> bool:
        return time.monotonic() < self._next_probe

    def _mark_down(self, exc: BaseException) -> None:
        if self._next_probe == 0.0:
            logger.error("database unreachable (%s): spilling call rows to disk", _short(exc))
        self._next_probe = time.monotonic() + self._probe_wait
        self._probe_wait = min(self._probe_wait * 2, self._retry_max_wait)

    def _mark_up(self) -> None:
        if self._next_probe != 0.0:
            logger.warning("database reachable again; %d spilled rows to replay", self.backlog)
        self._next_probe = 0.0
        self._probe_wait = PROBE_MIN_S


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    logger.warning(
        "call log write failed (attempt %d), retrying: %s", state.attempt_number, _short(exc)
    )


def _short(exc: BaseException | None) -> str:
    """The driver's message without SQLAlchemy's statement and parameters (a whole batch)."""
    return str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:300]
