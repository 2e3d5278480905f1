"""Which spill directories a proxy process owns, and taking over those no process owns any more.

A single proxy spills into its directory `D`; child `i` of `--workers N` into `D/worker-<i>`
(`supervisor`). When the same proxy comes back with another layout — fewer workers, or one
process instead of several, or the reverse — some of those directories belong to no process of
the new layout, and rows spilled there while the database was down would never be replayed: lost
calls. So at start every process takes over the orphans assigned to it:

- a single proxy: every `D/worker-*`;
- child `i` of `N`: `D/worker-<j>` for every `j >= N` with `j % N == i`, and child 0 also the
  segments lying in `D` itself (a single proxy's).

Taking over moves the segment files (one `rename` each, atomic on one file system) into the
process's own directory under fresh numbers, while holding the orphan's lock, so a directory a
live process still owns (e.g. an old proxy not stopped yet) is left alone, and a segment is never
in two directories: the replay stays exactly once. Refused rows and corrupt (`.bad`) segments stay
where they are, for an operator.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

WORKER_PREFIX = "worker-"
SUFFIX = ".seg"
LOCK_NAME = "LOCK"
JOURNAL_DIR = "journal"


def worker_spill_dir(base: Path, index: int) -> Path:
    """Where child `index` of a `--workers N` proxy spills."""
    return base / f"{WORKER_PREFIX}{index}"


def orphan_spill_dirs(base: Path, index: int | None = None, count: int = 1) -> list[Path]:
    """The directories whose segments this process takes over (module docstring).

    `index` None: a single proxy spilling into `base`; otherwise child `index` of `count`, whose
    own directory is `worker_spill_dir(base, index)`.
    """
    found: list[tuple[int, Path]] = []
    if base.is_dir():
        for path in base.iterdir():
            number = _worker_number(path)
            if number is not None and path.is_dir():
                found.append((number, path))
    found.sort()
    if index is None:
        return [path for _, path in found]
    orphans = [path for number, path in found if number >= count and number % count == index]
    return [base, *orphans] if index == 0 else orphans


def journal_dir(spill_dir: Path) -> Path:
    """Where the answer journal (`journal`) of the process spilling into `spill_dir` lives."""
    return spill_dir / JOURNAL_DIR


def taken_over(own: Path, index: int | None = None, count: int = 1) -> list[Path]:
    """Everything the process spilling into `own` (child `index` of `count`, or a single proxy)
    takes over at start: the answer journals a killed process left (the orphans' first, so their
    directories are empty when the orphans' own segments are moved) and the orphans."""
    orphans = orphan_spill_dirs(own if index is None else own.parent, index, count)
    return [*map(journal_dir, orphans), journal_dir(own), *orphans]


def adopt_segments(target: Path, sources: list[Path]) -> int:
    """Move the sealed segments of `sources` into `target` (locked by the caller); rows moved
    are replayed by the caller like its own. Returns the number of segment files moved."""
    moved = 0
    next_number = next_segment_number(target)
    for source in sources:
        if source.resolve() == target.resolve():
            continue
        count, next_number = _adopt_one(target, source, next_number)
        moved += count
    return moved


def _adopt_one(target: Path, source: Path, next_number: int) -> tuple[int, int]:
    if not any(source.glob(f"*{SUFFIX}")):  # nothing to take: leave no lock file behind either
        return 0, next_number
    try:
        lock = (source / LOCK_NAME).open("ab")
    except OSError as exc:
        logger.error("cannot take over the spill directory %s (%s)", source, exc)
        return 0, next_number
    moved = 0
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.warning("spill directory %s is owned by a running proxy: left to it", source)
            return 0, next_number
        for segment in sorted(source.glob(f"*{SUFFIX}")):
            os.rename(segment, target / f"{next_number:012d}{SUFFIX}")
            next_number += 1
            moved += 1
        if moved:
            fsync_dir(target)
            fsync_dir(source)
            logger.warning(
                "took over %d spill segment(s) from %s (the proxy ran with another --workers "
                "count); their rows will be replayed",
                moved,
                source,
            )
        _remove_if_empty(source)
    finally:
        lock.close()
    return moved, next_number


def _remove_if_empty(source: Path) -> None:
    """Leave no empty orphan behind (anything else in it, e.g. refused rows, keeps it)."""
    if any(path.name != LOCK_NAME for path in source.iterdir()):
        return
    with contextlib.suppress(OSError):
        (source / LOCK_NAME).unlink()
        source.rmdir()


def next_segment_number(directory: Path) -> int:
    numbers = [segment_number(path) for path in directory.glob(f"*{SUFFIX}")]
    return max(numbers, default=-1) + 1


def segment_number(path: Path) -> int:
    try:
        return int(path.stem)
    except ValueError:
        return 0


def _worker_number(path: Path) -> int | None:
    if not path.name.startswith(WORKER_PREFIX):
        return None
    tail = path.name[len(WORKER_PREFIX) :]
    return int(tail) if tail.isdigit() else None


def fsync_dir(directory: Path) -> None:
    """Make a file's creation or removal durable (POSIX needs the directory fsynced)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
