"""The answer journal: a call's row made durable on local disk before its answer leaves the proxy.

With durable answers (`writer`), an answer waits until its row survives a proxy killed with -9.
Committing each small group of rows to PostgreSQL for that costs a statement per group, and a
statement costs the writer several times what a file append does (docs/benchmarks.md, "Where
durability's cost goes"). So with a spill directory the writer appends each group to this
journal instead (one write and one fsync, the spill buffer's record format) and answers; it then
commits the journaled rows to PostgreSQL in the large batches of its lingering mode, every
`log_flush_interval_s` or sooner when a flush or a waiting stage asks (`hurry`), and empties the
journal once they are committed.

- A proxy killed between the fsync and the commit leaves the journal file behind, in
  `<spill dir>/journal/`. The next process takes it over like an orphaned spill directory
  (`spill_layout.adopt_segments`): its rows are replayed exactly once (`ON CONFLICT (id) DO
  NOTHING`, so rows committed just before the kill land once too).
- A commit that fails because the database is unreachable hands the journal file to the spill
  buffer as a sealed segment (one `rename`): from then on those rows are the outage backlog,
  counted and replayed as spilled rows, and later rows spill directly until the database is back.
- Emptying the journal after a commit is a truncate without an fsync: if a crash undoes it, the
  rows are replayed once more, which changes nothing.

Journaled rows are not spilled rows: the spill gauges and the call order's floor
(`seq_floor`) count the outage backlog only. The journal's rows belong to attempts whose
counters this process holds, as the rows queued for a commit did before it existed.
Not thread-safe: used on the writer thread only (`stats` reads a plain counter).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from io import FileIO
from pathlib import Path
from typing import Any

from polar_mq.proxy.store.spill import SpillBuffer
from polar_mq.proxy.store.spill_layout import LOCK_NAME, SUFFIX
from polar_mq.proxy.store.spill_records import encode_rows

logger = logging.getLogger(__name__)

JOURNAL_FILE = f"answers{SUFFIX}"


class AnswerJournal:
    """One append-only file of the rows answered and not yet committed (module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / JOURNAL_FILE
        self.rows = 0
        """Rows in the journal now (answered, not yet committed)."""
        self._handle: FileIO | None = None
        """Unbuffered: nothing is left in a buffer to be written after a cut-back."""
        self._size = 0
        """Bytes of whole records in the file: where a failed write is cut back to."""
        self._torn = False
        """A failed write could not be cut back: nothing more is appended behind it (a replay
        stops at a torn record) until the file is emptied."""
        self._failures = 0
        self._lock: FileIO | None = None

    def open(self) -> bool:
        """Create the journal's directory and lock it (`LOCK`, as a spill directory is locked),
        so that a proxy taking over orphaned spill directories leaves a live journal alone.
        False: the journal cannot be used (logged); answers then wait for their commit."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            lock = FileIO(self.directory / LOCK_NAME, "ab")
        except OSError as exc:
            logger.error(
                "answer journal unusable in %s (%s): answers wait for commits", self.directory, exc
            )
            return False
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock.close()
            logger.error("answer journal %s is locked by another process (%s)", self.directory, exc)
            return False
        self._lock = lock
        return True

    def append(self, rows: list[dict[str, Any]]) -> bool:
        """Write `rows` durably; False if they are not in the journal (the disk failed, or
        failed before): the caller stores them another way, nothing is dropped here."""
        if self._torn:
            return False
        record = encode_rows(rows)
        try:
            if self._handle is None:
                self._handle = FileIO(self.path, "ab")
                self._size = os.fstat(self._handle.fileno()).st_size
            _write_all(self._handle, record)
            os.fsync(self._handle.fileno())
        except OSError as exc:
            self._failed(exc)
            return False
        self._size += len(record)
        self.rows += len(rows)
        return True

    def clear(self) -> None:
        """Forget the journal's rows: they are committed (no fsync: module docstring)."""
        try:
            if self._handle is not None:
                os.ftruncate(self._handle.fileno(), 0)
            elif self._torn:
                os.truncate(self.path, 0)
        except OSError as exc:  # the rows are committed: a replay of them changes nothing
            logger.warning("answer journal not emptied (%s)", exc)
            self._close_handle()
        else:
            self._torn = False
        self._size = 0
        self.rows = 0

    def hand_over(self, spill: SpillBuffer) -> None:
        """Make the journal's rows spill backlog (the database is unreachable): the file becomes
        one of the buffer's sealed segments."""
        rows = self.rows
        self._close_handle()
        self.rows, self._size, self._torn = 0, 0, False
        if rows and self.path.exists():
            spill.take_segment(self.path, rows)

    def close(self) -> None:
        """Release the file and the lock; an empty journal leaves nothing behind (a non-empty
        one is taken over by the next process)."""
        self._close_handle()
        if self._lock is None:
            return
        with contextlib.suppress(OSError):
            if self.path.exists() and self.path.stat().st_size == 0:
                self.path.unlink()
            if not self.path.exists():
                (self.directory / LOCK_NAME).unlink()
                self.directory.rmdir()
        self._lock.close()
        self._lock = None

    def _failed(self, exc: OSError) -> None:
        """Cut a failed write back to the last whole record, so later records stay readable."""
        self._failures += 1
        if self._failures & (self._failures - 1) == 0:  # log at 1, 2, 4, 8, ... failures
            logger.error("answer journal write failed (%s): those rows are committed directly", exc)
        try:
            if self._handle is None:
                raise exc
            os.ftruncate(self._handle.fileno(), self._size)
        except OSError:
            self._torn = True
            self._close_handle()

    def _close_handle(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(OSError):
                self._handle.close()
            self._handle = None


def _write_all(handle: FileIO, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = handle.write(view)
        if not written:
            raise OSError("the journal file took no bytes")
        view = view[written:]
