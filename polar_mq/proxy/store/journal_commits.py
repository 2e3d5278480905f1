"""Committing the answer journal's rows beside the journaling of newer ones.

The writer thread answers a group of calls once the group is in the answer journal (`journal`)
and commits the journaled rows to PostgreSQL in batches later. A commit of a linger's rows takes
milliseconds; on the writer thread, every answer arriving meanwhile would wait for it, and be
journaled only after: all of the proxy's answers stalled at every commit. So the commit runs on
a thread of its own while the writer journals into the journal's other file (`rotate`). One
commit at a time: rows journaled meanwhile go in the next.

While a commit runs, the writer thread touches neither the database nor the spill buffer
(`CallStore` is single-threaded, on one connection). A batch the journal cannot take waits for
the commit to end (`settle(wait=True)`) before it is stored directly, and the spill replay waits
too (`busy`). The commit thread's end wakes the writer thread (`wake`), which settles it: the
retired file is emptied, or handed to the spill buffer when the database was unreachable.

With a journal written without fdatasync (`POLAR_MQ_PROXY_JOURNAL_SYNC=write`) the serving loop
journals each row itself as it is submitted (`keep` from the loop, `writer.DbCallWriter.submit`):
a `pwrite` is cheaper than handing the row to the writer thread and waiting for its turn. So
`keep` and the rotation of the journal's files hold a lock: a row is in the active file and in
`journaled`, or in the retired file and in `committing`, never in one and not the other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from polar_mq.proxy.store.call_store import CallStore
from polar_mq.proxy.store.journal import AnswerJournal

logger = logging.getLogger(__name__)

Row = dict[str, Any]


class JournaledCommits:
    """The journal's rows, and their commits on a thread of their own (module docstring).

    Used from the writer thread, and `keep` from the serving loop too; `rows` and the totals may
    be read from others."""

    def __init__(
        self,
        journal: AnswerJournal,
        *,
        interval_s: float,
        batch_size: int,
        wake: Callable[[], None],
    ) -> None:
        self.journal = journal
        self._interval = interval_s
        self._batch_size = batch_size
        self._wake = wake
        self.journaled: list[Row] = []
        """Rows in the active file, not yet committed (in the journal's order)."""
        self.committing: list[Row] = []
        """Rows in the retired file: being committed, or to be again (a hand-over failed)."""
        self.journaled_total = 0
        self.settled_total = 0
        """Rows ever journaled, and of those, rows ever committed or handed over: rows leave the
        journal in the order they came, so a flush waits until `settled_total` reaches the
        `journaled_total` its rows were counted in (never for rows journaled after them)."""
        self._due = 0.0
        """When the pending rows are committed at the latest."""
        self._running: Future[bool] | None = None
        self._lock = threading.Lock()
        """Held by `keep` and the rotation (module docstring)."""
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="call-commit")

    @property
    def rows(self) -> int:
        """Rows answered from the journal and not yet committed: a flush waits for them."""
        return len(self.committing) + len(self.journaled)

    @property
    def busy(self) -> bool:
        """A commit is running: the writer thread must leave the store alone."""
        return self._running is not None

    def keep(self, rows: list[Row]) -> int:
        """Journal `rows`: the rows now waiting in the active file for a commit, `rows` among
        them (durable); 0: the disk failed, the caller stores them."""
        with self._lock:
            if not self.journal.append(rows):
                return 0
            journaled = self.journaled
            if not journaled:
                self._due = time.monotonic() + self._interval
            journaled.extend(rows)
            self.journaled_total += len(rows)
            return len(journaled)

    def wants_commit(self, journaled: int) -> bool:
        """Whether the writer thread is to be woken after `keep` returned `journaled` for one
        row: it is the first of a linger (whose end the thread must time) or fills a batch."""
        return journaled == 1 or journaled == self._batch_size

    def hurry(self) -> None:
        """Commit the pending rows as soon as no commit runs (a flush or a waiting stage)."""
        self._due = 0.0

    def wait_s(self) -> float | None:
        """How long the writer thread may wait for rows before a commit is due; None: nothing is
        due (nothing pending, or a commit runs, whose end wakes the thread)."""
        if self._running is not None or not self.rows:
            return None
        return max(0.0, self._due - time.monotonic())

    def advance(self, store: CallStore) -> bool:
        """Settle a commit that ended and start the next if it is due; True if rows left the
        journal (committed or handed over), so that waiting flushes are checked."""
        settled = self.settle(store, wait=False)
        if self._running is None and self.rows and self._is_due():
            self._start(store)
        return settled

    def finish(self, store: CallStore) -> None:
        """Commit everything pending and wait (the writer is stopping). Rows whose commit failed
        and could not be handed over stay in their file, for the next process to take over."""
        self.settle(store, wait=True)
        if self.committing:
            self._start(store)  # a hand-over that failed: one more try
            self.settle(store, wait=True)
        if self.journaled and not self.committing:
            self._start(store)
            self.settle(store, wait=True)

    def close(self) -> None:
        """Stop the commit thread (a commit still running ends first: the writer crashed)."""
        self._pool.shutdown(wait=True)

    def settle(self, store: CallStore, *, wait: bool) -> bool:
        """Take the result of an ended commit (waiting for a running one if `wait`): the retired
        file emptied, or handed to the spill buffer. True if rows left the journal."""
        running = self._running
        if running is None or (not wait and not running.done()):
            return False
        self._running = None
        if running.result():
            self.journal.clear_retired()
        else:
            assert store.spill is not None  # a journal is kept only with a spill directory
            if not self.journal.hand_over_retired(store.spill):  # kept: tried again later
                self._due = time.monotonic() + self._interval
                return False
        self.settled_total += len(self.committing)
        self.committing = []
        return True

    def _is_due(self) -> bool:
        return len(self.journaled) >= self._batch_size or time.monotonic() >= self._due

    def _start(self, store: CallStore) -> None:
        """Commit the retired file's rows (again), or retire the active file and commit its."""
        if not self.committing:
            with self._lock:  # the serving loop may be journaling a row (module docstring)
                # `committing` is set before `journaled` is emptied: a flush on another thread
                # reads `rows` meanwhile and must never see the rows in neither list
                self.committing = self.journaled
                self.journaled = []
                self.journal.rotate()
        self._running = self._pool.submit(store.commit_journaled, self.committing)
        self._running.add_done_callback(self._ended)

    def _ended(self, _: Future[bool]) -> None:
        self._wake()
