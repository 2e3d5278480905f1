"""Reading and writing a sandbox's files from the worker without following the agent's links.

The worker reads and writes files in a workspace the agent controlled until a moment ago: the
answer file, a reward file, a JUnit report, the hidden tests it writes before grading. Resolving a
path first and opening it after (`Path.resolve()` then `open`) lets the agent point any component
at another file, inside the sandbox (a reward file of its choosing) or outside it (`/etc/passwd`,
another rollout's workspace), and swap it between the check and the use. So every component is
opened relative to the directory opened before it (`dir_fd`) with `O_NOFOLLOW`: a symlink
anywhere on the way, a component that is not a directory, or a path leaving the sandbox root is
refused with `UnsafePath`, which evaluators score as the agent's doing. Special files (FIFOs,
devices) are refused too: a FIFO would block the reader forever.

Writes go to a temporary name in the parent directory (opened the same way) and are renamed over
the destination, so a reader never sees half a file; an existing symlink at the destination is
refused, not replaced, since the agent planted it where the grader writes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_LINK_ERRORS = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)
"""What `O_NOFOLLOW`/`O_DIRECTORY` give on a symlink or a non-directory (EMLINK on FreeBSD)."""


class UnsafePath(ValueError):
    """A sandbox path the worker refuses: a symlink or non-directory on the way, a special file,
    or a path outside the sandbox. Subclasses ValueError, as a path outside the runtime was."""


def relative_parts(root: Path, path: str | os.PathLike[str], base: Path) -> list[str]:
    """`path` (absolute, or relative to `base`) as components below `root`, judged lexically
    (nothing is resolved: `..` only ever climbs the path as written)."""
    candidate = PurePosixPath(os.fspath(path))
    joined = candidate if candidate.is_absolute() else PurePosixPath(base) / candidate
    full = PurePosixPath(os.path.normpath(joined))
    top = PurePosixPath(os.path.normpath(root))
    if "\x00" in str(full) or not full.is_relative_to(top) or full == top:
        raise UnsafePath(f"path {os.fspath(path)!r} is outside runtime {root.name}")
    return list(full.relative_to(top).parts)


@contextlib.contextmanager
def _walk(root: Path, parts: list[str], create: bool) -> Iterator[int]:
    """A descriptor of the directory holding `parts[-1]`, reached without following links."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts[:-1]):
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                child = _open_dir(name, fd, parts[: i + 1])
            except OSError as exc:
                if exc.errno in _LINK_ERRORS:
                    raise _refused(parts[: i + 1], "a symlink or not a directory") from exc
                raise
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _open_dir(name: str, fd: int, where: list[str]) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno in _LINK_ERRORS:
            raise _refused(where, "a symlink or not a directory") from exc
        raise


def _refused(parts: list[str], what: str) -> UnsafePath:
    return UnsafePath(f"{'/'.join(parts)} is {what} (planted in the workspace?): refused")


def read_file(root: Path, path: str | os.PathLike[str], base: Path) -> bytes:
    """The bytes of a regular file under `root`, reached without following any link."""
    parts = relative_parts(root, path, base)
    with _walk(root, parts, create=False) as parent:
        try:
            fd = os.open(parts[-1], _READ_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in _LINK_ERRORS:
                raise _refused(parts, "a symlink") from exc
            raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise _refused(parts, what)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)


def write_file(root: Path, path: str | os.PathLike[str], base: Path, data: bytes) -> None:
    """Write `data` atomically to a path under `root`, creating missing directories, never
    following a link (an existing symlink at the destination is refused)."""
    parts = relative_parts(root, path, base)
    with _walk(root, parts, create=True) as parent:
        name = parts[-1]
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode):
                raise _refused(parts, "a symlink")
        temp = f".{name[:100]}.{uuid.uuid4().hex}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o644, dir_fd=parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=parent)
            raise


def refuse_links(root: Path, path: str | os.PathLike[str], base: Path) -> None:
    """Raise `UnsafePath` if any existing component of `path` is a symlink (a missing tail is
    fine: the grader creates it)."""
    parts = relative_parts(root, path, base)
    try:
        with _walk(root, parts, create=False) as parent:
            mode = os.lstat(parts[-1], dir_fd=parent).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise _refused(parts, "a symlink")
