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
- The file is recycled. Emptying it after a commit writes an end mark (`spill_records.END`) at
  its start, without an fsync (if a crash undoes it, committed rows are replayed once more, which
  changes nothing), and the next records overwrite the blocks already written. So a record's
  `fdatasync` flushes its data only, not a grown size and block map, which on ext4 takes half
  the CPU and a fifth of the time of an append's fsync (docs/benchmarks.md). Every write ends in
  an end mark, so a reader stops where the journal's records end, before older contents.

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
import time
from io import FileIO
from pathlib import Path
from typing import Any

from polar_mq.proxy.store.spill import SpillBuffer
from polar_mq.proxy.store.spill_layout import LOCK_NAME, SUFFIX
from polar_mq.proxy.store.spill_records import END, encode_rows, read_segment

logger = logging.getLogger(__name__)

JOURNAL_FILE = f"answers{SUFFIX}"


class AnswerJournal:
    """One recycled file of the rows answered and not yet committed (module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / JOURNAL_FILE
        self.rows = 0
        """Rows in the journal now (answered, not yet committed)."""
        self._fd: int | None = None
        """Raw, without O_APPEND: records are written at `_size` (`os.pwrite`)."""
        self._size = 0
        """Bytes of whole records: where the next record (and the end mark after it) goes."""
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
        """Write `rows` durably; False if they are not in the journal (the disk failed): the
        caller stores them another way, nothing is dropped here. The next write overwrites a
        failed one (meanwhile a reader stops at a torn record, or replays rows the caller also
        stored: `ON CONFLICT DO NOTHING`)."""
        record = encode_rows(rows)
        try:
            fd = self._file()
            _write_all(fd, record + END, self._size)
            os.fdatasync(fd)
        except OSError as exc:
            self._failed(exc)
            return False
        self._size += len(record)
        self.rows += len(rows)
        return True

    def clear(self) -> None:
        """Forget the journal's rows: they are committed (no fsync: module docstring)."""
        if self._fd is not None:
            try:
                _write_all(self._fd, END, 0)
            except OSError as exc:  # the rows are committed: a replay of them changes nothing
                logger.warning("answer journal not emptied (%s)", exc)
                self._close_handle()
        self._size = 0
        self.rows = 0

    def hand_over(self, spill: SpillBuffer) -> bool:
        """Make the journal's rows spill backlog (the database is unreachable): the file, cut to
        its records, becomes one of the buffer's sealed segments. False if it could not be moved
        (logged): the rows stay journaled, for the next commit or hand-over to take."""
        rows = self.rows
        if not rows:
            return True
        if self._fd is not None:
            with contextlib.suppress(OSError):  # uncut, a reader still stops at the end mark
                os.ftruncate(self._fd, self._size)
        try:
            spill.take_segment(self.path, rows)
        except OSError as exc:
            logger.error("answer journal not handed to the spill buffer (%s): kept", exc)
            return False
        self._close_handle()  # the file is the buffer's now: the next record starts a new one
        self.rows, self._size = 0, 0
        return True

    def close(self) -> None:
        """Release the file and the lock; an empty journal leaves nothing behind (a non-empty
        one is taken over by the next process)."""
        self._close_handle()
        if self._lock is None:
            return
        with contextlib.suppress(OSError):
            if self.rows == 0:  # committed, or never written
                self.path.unlink(missing_ok=True)
            if not self.path.exists():
                (self.directory / LOCK_NAME).unlink()
                self.directory.rmdir()
        self._lock.close()
        self._lock = None

    def _file(self) -> int:
        """The journal's descriptor, opened on first use. A file already there holds rows no
        process has taken over (a takeover at start moves it away first): it is set aside as a
        segment of its own, which the next process's takeover adopts, never overwritten."""
        if self._fd is None:
            if self.path.exists() and read_segment(self.path)[0]:
                aside = self.path.with_name(f"{time.time_ns()}{SUFFIX}")
                os.rename(self.path, aside)
                logger.error("answer journal %s held rows: kept as %s", self.path, aside)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._size = 0
        return self._fd

    def _failed(self, exc: OSError) -> None:
        self._failures += 1
        if self._failures & (self._failures - 1) == 0:  # log at 1, 2, 4, 8, ... failures
            logger.error("answer journal write failed (%s): those rows are committed directly", exc)

    def _close_handle(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if not written:
            raise OSError("the journal file took no bytes")
        view = view[written:]
        offset += written
