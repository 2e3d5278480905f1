"""The answer journal: a call's row made durable on local disk before its answer leaves the proxy.

With durable answers (`writer`), an answer waits until its row survives a proxy killed with -9.
Committing each small group of rows to PostgreSQL for that costs a statement per group, and a
statement costs the writer several times what a file append does (docs/benchmarks.md, "Where
durability's cost goes"). So with a spill directory the writer appends each group to this
journal instead (one write and one fdatasync, the spill buffer's record format) and answers; the
journaled rows are committed to PostgreSQL later, in the large batches of its lingering mode
(`journal_commits`), and their file is emptied once they are committed.

There are two files. The active one takes records; a commit retires it (`rotate`) and records
go to the other meanwhile, so answers never wait for a commit (`journal_commits`). The retired
file is emptied after its commit and is the spare for the next one.

- A proxy killed between an fsync and the commit leaves the files behind, in
  `<spill dir>/journal/`. The next process takes them over like an orphaned spill directory
  (`spill_layout.adopt_segments`): their rows are replayed exactly once (`ON CONFLICT (id) DO
  NOTHING`, so rows committed just before the kill land once too).
- A commit that fails because the database is unreachable hands the retired file to the spill
  buffer as a sealed segment (one `rename`): from then on those rows are the outage backlog,
  counted and replayed as spilled rows, and later rows spill directly until the database is back.
- The files are recycled. Emptying one after a commit writes an end mark (`spill_records.END`)
  at its start, without an fsync (if a crash undoes it, committed rows are replayed once more,
  which changes nothing), and the next records overwrite the blocks already written. So a
  record's `fdatasync` flushes its data only, not a grown size and block map, which on ext4 takes
  half the CPU and a fifth of the time of an append's fsync (docs/benchmarks.md). Every write
  ends in an end mark, so a reader stops where the file's records end, before older contents.

What survives what: a record is written (`pwrite`) before its answer leaves, so a proxy killed
with -9 (or by the OOM killer) leaves it in the kernel's page cache, which writes it out. With
`sync` (`POLAR_MQ_PROXY_JOURNAL_SYNC=fdatasync`) it is also on the disk before the answer, so a
crash of the host spares it too; `write` saves that fdatasync per group of answers, and a host
crash then loses the rows answered within the last flush interval (their commit was to follow),
which the run-agent stage's call receipts find missing. A file that is to be the rows' only copy
for longer (handed to the spill buffer, or left at close) is synced in either mode.

Journaled rows are not spilled rows: the spill gauges and the call order's floor
(`seq_floor`) count the outage backlog only. The journal's rows belong to attempts whose
counters this process holds, as the rows queued for a commit did before it existed.
Not thread-safe: `append` and `rotate` run under `journal_commits.JournaledCommits`' lock (the
serving loop appends in `write` mode), the rest on the writer thread (`rows` reads plain counters).
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

JOURNAL_FILES = (f"answers-0{SUFFIX}", f"answers-1{SUFFIX}")
"""The two files a journal alternates between: one taking records, one whose rows a commit
holds (`journal_commits`)."""


class AnswerJournal:
    """Two recycled files of the rows answered and not yet committed (module docstring): the
    active one takes records; `rotate` retires it for a commit and activates the other."""

    def __init__(self, directory: Path, *, sync: bool = True) -> None:
        self.directory = directory
        self._files = [JournalFile(directory / name, sync=sync) for name in JOURNAL_FILES]
        self.active = self._files[0]
        self.retired: JournalFile | None = None
        """The file whose rows a commit holds, until `clear_retired` or `hand_over_retired`."""
        self._failures = 0
        self._lock: FileIO | None = None

    @property
    def path(self) -> Path:
        """The active file's path."""
        return self.active.path

    @property
    def rows(self) -> int:
        """Rows in the journal now (answered, not yet committed), in both files."""
        return sum(file.rows for file in self._files)

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
        """Write `rows` durably to the active file; False if they are not in the journal (the
        disk failed): the caller stores them another way, nothing is dropped here."""
        try:
            self.active.append(rows)
        except OSError as exc:
            self._failures += 1
            if self._failures & (self._failures - 1) == 0:  # log at 1, 2, 4, 8, ... failures
                logger.error("answer journal write failed (%s): those rows are committed now", exc)
            return False
        return True

    def rotate(self) -> None:
        """Retire the active file (a commit takes its rows) and activate the other, which must
        be empty: one file retired at a time."""
        if self.retired is not None:
            raise RuntimeError("a retired journal file is still pending")
        spare = next(file for file in self._files if file is not self.active)
        self.retired, self.active = self.active, spare

    def clear_retired(self) -> None:
        """Forget the retired file's rows (committed); it is the spare now."""
        if self.retired is not None:
            self.retired.clear()
            self.retired = None

    def hand_over_retired(self, spill: SpillBuffer) -> bool:
        """Make the retired file's rows spill backlog (the database is unreachable): cut to its
        records, it becomes one of the buffer's sealed segments. False if it could not be moved
        (logged): it stays retired, for the next commit or hand-over to take."""
        if self.retired is None:
            return True
        if not self.retired.hand_over(spill):
            return False
        self.retired = None
        return True

    def close(self) -> None:
        """Release the files and the lock; an empty journal leaves nothing behind (a non-empty
        file is taken over by the next process)."""
        for file in self._files:
            if file.rows:  # left for the next process: on disk, whatever `sync` says
                with contextlib.suppress(OSError):
                    file.flush_to_disk()
            file.close_handle()
        if self._lock is None:
            return
        with contextlib.suppress(OSError):
            for file in self._files:
                if file.rows == 0:  # committed, or never written
                    file.path.unlink(missing_ok=True)
            if not any(file.path.exists() for file in self._files):
                (self.directory / LOCK_NAME).unlink()
                self.directory.rmdir()
        self._lock.close()
        self._lock = None


class JournalFile:
    """One recycled journal file: records written in place, then an end mark (module docstring).
    Its methods raise `OSError`; `AnswerJournal` decides what a failure means."""

    def __init__(self, path: Path, *, sync: bool = True) -> None:
        self.path = path
        self.sync = sync
        """fdatasync each record (a host's crash spares it); False: written only (a kill of the
        process spares it: the kernel holds the page)."""
        self.rows = 0
        self._fd: int | None = None
        """Raw, without O_APPEND: records are written at `_size` (`os.pwrite`)."""
        self._size = 0
        """Bytes of whole records: where the next record (and the end mark after it) goes."""

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Write `rows` (and fdatasync them, with `sync`). A failed write is overwritten by the
        next one (meanwhile a reader stops at a torn record, or replays rows the caller also
        stored: `ON CONFLICT DO NOTHING`)."""
        record = encode_rows(rows)
        fd = self._file()
        _write_all(fd, record + END, self._size)
        if self.sync:
            os.fdatasync(fd)
        self._size += len(record)
        self.rows += len(rows)

    def clear(self) -> None:
        """Forget the rows: they are committed (an end mark at the start, no fsync)."""
        if self._fd is not None:
            try:
                _write_all(self._fd, END, 0)
            except OSError as exc:  # the rows are committed: a replay of them changes nothing
                logger.warning("answer journal not emptied (%s)", exc)
                self.close_handle()
        self._size = 0
        self.rows = 0

    def hand_over(self, spill: SpillBuffer) -> bool:
        """Move the file into the spill buffer as a sealed segment; False if it could not be
        moved (logged): the rows stay here."""
        if not self.rows:
            return True
        try:
            self.flush_to_disk()  # spill backlog survives a host's crash, whatever `sync` says
            spill.take_segment(self.path, self.rows)
        except OSError as exc:
            logger.error("answer journal not handed to the spill buffer (%s): kept", exc)
            return False
        self.close_handle()  # the file is the buffer's now: the next record starts a new one
        self.rows, self._size = 0, 0
        return True

    def flush_to_disk(self) -> None:
        """Cut the file to its records and fdatasync it (it outlives this process's use)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):  # uncut, a reader still stops at the end mark
                os.ftruncate(self._fd, self._size)
            os.fdatasync(self._fd)

    def close_handle(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _file(self) -> int:
        """The descriptor, opened on first use. A file already there holds rows no process has
        taken over (a takeover at start moves it away first): it is set aside as a segment of
        its own, which the next process's takeover adopts, never overwritten."""
        if self._fd is None:
            if self.path.exists() and read_segment(self.path)[0]:
                aside = self.path.with_name(f"{time.time_ns()}{SUFFIX}")
                os.rename(self.path, aside)
                logger.error("answer journal %s held rows: kept as %s", self.path, aside)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._size = 0
        return self._fd


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if not written:
            raise OSError("the journal file took no bytes")
        view = view[written:]
        offset += written
