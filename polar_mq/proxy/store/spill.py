"""The proxy's local durable buffer for call rows the database could not take (SPEC §4).

Why segment files and not SQLite: the buffer is written only while the database is down and read
once, in order, when it is back, so all it needs is an append-only log. A segment file is a run of
records `<u32 length><u32 crc32><u32 rows><orjson list of rows>`, one per batch, written and
`fsync`ed before the batch counts as spilled. That costs one write and one fsync per batch (no
page or WAL bookkeeping), a torn or corrupt tail record (crash mid-append, bad disk) is detected by
its length or checksum and everything before it is still replayed, and a replayed segment is
deleted as a whole file, only after its rows are committed: a crash between commit and delete
replays it again, which `INSERT ... ON CONFLICT (id) DO NOTHING` makes harmless (exactly once).

Overflow policy: the buffer never grows past `max_bytes`. A batch that does not fit is dropped
whole (newest data dropped, older spilled data kept, since it is closer to being replayed), and
its rows are counted in `dropped_rows`; a failing disk (OSError) counts the same way.

Rows the database *refuses* (a constraint, a value it cannot take: not an outage) are never
replayed automatically, since they would be refused again and hold up the rows behind them; they
are appended to `refused/rows.seg` in the same record format (one row per record), kept for an
operator: once the cause is fixed (e.g. a column widened), moving that file into the spill
directory, named after the last `.seg` there, makes the next proxy start replay it.

One process owns a spill directory at a time (an exclusive `flock` on `LOCK`), so two proxies
pointed at one directory fail at start instead of replaying each other's rows twice.
`open()` runs once at start, everything else on the writer thread; `stats()` only reads plain
counters from the event loop. Nothing here is thread-safe by itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from polar_mq.proxy.store.spill_layout import (
    LOCK_NAME,
    SUFFIX,
    adopt_segments,
    fsync_dir,
    segment_number,
)
from polar_mq.proxy.store.spill_records import count_rows, encode_rows, read_segment

logger = logging.getLogger(__name__)

BAD_SUFFIX = ".bad"
REFUSED_DIR = "refused"
REFUSED_FILE = "rows.seg"
DEFAULT_SEGMENT_BYTES = 4 * 1024 * 1024
"""A segment is sealed past this size; replay loads one segment's rows at a time."""


class SpillUnavailable(RuntimeError):
    """The spill directory cannot be used: the proxy refuses to start without its buffer."""


class SpillLocked(SpillUnavailable):
    """Another process already owns this spill directory."""


@dataclass(slots=True)
class Segment:
    path: Path
    size: int
    rows: int


@dataclass(slots=True)
class SegmentRead:
    """What a sealed segment holds: its intact rows, and whether a bad record ended it early."""

    segment: Segment
    rows: list[dict[str, Any]]
    corrupt: bool


class SpillBuffer:
    """Append-only segment files under `directory`, bounded by `max_bytes` (module docstring)."""

    def __init__(
        self,
        directory: Path,
        max_bytes: int,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        adopt_from: Sequence[Path] = (),
    ) -> None:
        self.directory = directory
        self.adopt_from = list(adopt_from)
        """Orphaned spill directories whose segments `open` takes over (`spill_layout`)."""
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.dropped_rows = 0
        self._drops = 0
        self.spilled_total = 0
        self.refused_kept = 0
        self._sealed: list[Segment] = []
        self._active: Segment | None = None
        self._handle: IO[bytes] | None = None
        self._lock: IO[bytes] | None = None
        self._next = 0

    # --- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        """Lock the directory and take over the segments a previous process left (to replay)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            lock = (self.directory / LOCK_NAME).open("ab")
        except OSError as exc:
            raise SpillUnavailable(
                f"cannot use the spill directory {self.directory} ({exc}); set "
                "POLAR_MQ_PROXY_SPILL_DIR to a writable directory, or "
                "POLAR_MQ_PROXY_SPILL_MAX_BYTES=0 to turn spilling off"
            ) from exc
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            lock.close()
            raise SpillLocked(
                f"spill directory {self.directory} is used by another process"
            ) from exc
        self._lock = lock
        adopt_segments(self.directory, self.adopt_from)
        for path in sorted(self.directory.glob(f"*{SUFFIX}")):
            self._sealed.append(Segment(path, path.stat().st_size, count_rows(path)))
            self._next = max(self._next, segment_number(path) + 1)
        if self._sealed:
            logger.warning(
                "spill directory %s holds %d rows from a previous run; they will be replayed",
                self.directory,
                self.rows,
            )

    def close(self) -> None:
        """Seal the active segment and release the directory (segments stay for the next run)."""
        self.seal()
        if self._lock is not None:
            if not self._sealed:  # nothing left to replay: leave no trace (refused rows stay)
                with contextlib.suppress(OSError):
                    (self.directory / LOCK_NAME).unlink()
                    self.directory.rmdir()
            self._lock.close()
            self._lock = None

    # --- writing -----------------------------------------------------------------------------

    def append(self, rows: list[dict[str, Any]]) -> bool:
        """Write one batch durably; False (rows counted as dropped) when it does not fit."""
        record = encode_rows(rows)
        if self.bytes + len(record) > self.max_bytes:
            self._drop(rows, f"spill buffer full ({self.bytes} of {self.max_bytes} bytes)")
            return False
        try:
            if self._active is None or self._active.size >= self.segment_bytes:
                self.seal()
                self._open_segment()
            assert self._active is not None and self._handle is not None
            self._handle.write(record)
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as exc:
            self._drop(rows, f"spill write failed: {exc}")
            self._abandon_active()
            return False
        self._active.size += len(record)
        self._active.rows += len(rows)
        self.spilled_total += len(rows)
        return True

    def keep_refused(self, row: dict[str, Any]) -> Path | None:
        """Keep a row the database refused, durably, apart from the replay (module docstring);
        the file it went to, or None if the disk failed too (the caller logs the row)."""
        path = self.directory / REFUSED_DIR / REFUSED_FILE
        try:
            path.parent.mkdir(exist_ok=True)
            with path.open("ab") as handle:
                handle.write(encode_rows([row]))
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            logger.error("cannot keep a refused call row in %s: %s", path, exc)
            return None
        self.refused_kept += 1
        return path

    def take_segment(self, path: Path, rows: int) -> None:
        """Adopt a file of records written elsewhere (the answer journal's, `journal`) as a
        sealed segment: moved in with one `rename`, its rows counted as spilled."""
        target = self.directory / f"{self._next:012d}{SUFFIX}"
        size = path.stat().st_size
        os.rename(path, target)  # raises with nothing changed
        self._next += 1
        self._sealed.append(Segment(target, size, rows))
        self.spilled_total += rows
        try:
            fsync_dir(self.directory)
        except OSError as exc:  # moved and counted: only a power loss could undo the rename
            logger.error("spill directory %s not synced after a hand-over (%s)", target, exc)

    def seal(self) -> None:
        """Close the segment being appended to, so that it can be replayed."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._active is not None:
            self._sealed.append(self._active)
            self._active = None

    # --- replay ------------------------------------------------------------------------------

    def oldest(self) -> SegmentRead | None:
        """The oldest segment's rows (sealing the active one if it is the only one left)."""
        if not self._sealed:
            self.seal()
        if not self._sealed:
            return None
        segment = self._sealed[0]
        try:
            rows, _, corrupt = read_segment(segment.path)
        except OSError as exc:
            logger.error("cannot read spill segment %s (%s): set aside", segment.path, exc)
            rows, corrupt = [], True
        if corrupt:
            logger.error(
                "spill segment %s ends in a torn or corrupt record: %d intact rows replayed, "
                "the rest is unreadable",
                segment.path,
                len(rows),
            )
        return SegmentRead(segment, rows, corrupt)

    def remove(self, read: SegmentRead) -> None:
        """Forget a segment whose rows are committed (a corrupt one is kept aside as `.bad`)."""
        self._sealed.remove(read.segment)
        path = read.segment.path
        with contextlib.suppress(FileNotFoundError):
            if read.corrupt:
                path.rename(path.with_suffix(BAD_SUFFIX))
            else:
                path.unlink()
        fsync_dir(self.directory)

    # --- accounting --------------------------------------------------------------------------

    @property
    def rows(self) -> int:
        """Rows waiting on disk to be replayed."""
        active = self._active.rows if self._active else 0
        return active + sum(s.rows for s in self._sealed)

    @property
    def empty(self) -> bool:
        """Nothing to replay (a segment left with only a torn record still needs clearing)."""
        return not self._sealed and (self._active is None or self._active.rows == 0)

    @property
    def bytes(self) -> int:
        active = self._active.size if self._active else 0
        return active + sum(s.size for s in self._sealed)

    def segments(self) -> Iterator[Path]:
        yield from (s.path for s in self._sealed)
        if self._active is not None:
            yield self._active.path

    def _open_segment(self) -> None:
        path = self.directory / f"{self._next:012d}{SUFFIX}"
        self._next += 1
        self._handle = path.open("ab")
        self._active = Segment(path, 0, 0)
        fsync_dir(self.directory)

    def _abandon_active(self) -> None:
        """After a failed write the segment may end in a partial record: seal it as it is."""
        if self._active is not None:
            with contextlib.suppress(OSError):
                self._active.size = self._active.path.stat().st_size
        self.seal()

    def _drop(self, rows: list[dict[str, Any]], why: str) -> None:
        self._drops += 1
        self.dropped_rows += len(rows)
        if self._drops & (self._drops - 1) == 0:  # log at the 1st, 2nd, 4th, 8th, ... drop
            logger.error("%s: %d call rows dropped so far", why, self.dropped_rows)
