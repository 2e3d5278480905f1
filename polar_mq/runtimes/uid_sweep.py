"""Everything a `local` pool user left on the node: its processes and its shared temporary files.

Under `local` the uid is the rollout's boundary, and a pool uid passes from one runtime to the
next. The environment tag cannot find a process that re-executed itself with `env -i`, so a
tag-only stop let such a daemon live on under the uid, read the next holder's agent environment
(`/proc/<pid>/environ` is readable by the same uid) and call the proxy with its token. So a stop
kills *every* process of the pool uid until none is left (`kill_uid`), and the pool checks again
before it hands the uid out (`agent_pool`); a uid with a survivor is quarantined, never reused.

Processes are found by the owner of `/proc/<pid>` (the effective uid) and by their real uid
(`/proc/<pid>/status`, only read for the few that match neither cheaply), and killed through a
pidfd opened before the owner is checked again: a pid recycled between the scan and the kill is
never signalled. Zombies do not count (they run nothing and their parent reaps them).

`remove_files_of` deletes what the uid left in the node's shared temporary directories (`/tmp`,
`/dev/shm`, `/var/tmp`): with the private mount view the agent never writes there (it gets its own
tmpfs), without it this is what keeps those files from reaching the uid's next holder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import time
from pathlib import Path

SHARED_TMP_DIRS = (Path("/tmp"), Path("/dev/shm"), Path("/var/tmp"))
_MAX_DEPTH = 4
"""How deep `remove_files_of` looks into shared, writable directories of other owners."""


def pids_of(uid: int, setuid_root: bool = True) -> list[int]:
    """Live (not zombie) processes whose effective or real uid is `uid`; never this process.

    `setuid_root` False skips the root processes (a setuid-root program the uid ran, whose real
    uid is still the uid's): a status read per root process of the node, which a caller that
    already killed the runtime's kill group (where such a program is too) can spare."""
    me = os.getpid()
    found: list[int] = []
    for name in _proc_entries():
        pid = int(name)
        if pid != me and _runs_as(pid, uid, setuid_root):
            found.append(pid)
    return found


def kill_uid(uid: int, deadline_s: float = 10.0, setuid_root: bool = True) -> list[int]:
    """SIGKILL every process of `uid` until none is left; return those still alive at the
    deadline. Never for uid 0 or this process's own uid (that would be the worker itself)."""
    if uid == 0 or uid == os.geteuid():
        raise ValueError(f"refusing to kill every process of uid {uid}")
    end = time.monotonic() + deadline_s
    while True:
        alive = pids_of(uid, setuid_root)
        if not alive:
            return []
        if time.monotonic() >= end:
            return alive
        for pid in alive:
            _kill(pid, uid)
        time.sleep(0.005)  # let the kernel finish the exits before the next scan


def remove_files_of(
    uid: int, roots: tuple[Path, ...] = SHARED_TMP_DIRS, max_depth: int = _MAX_DEPTH
) -> list[str]:
    """Delete every entry owned by `uid` in the shared temporary directories (links are removed,
    never followed); return the paths that could not be removed."""
    if uid == 0 or uid == os.geteuid():
        raise ValueError(f"refusing to remove every file of uid {uid}")
    failed: list[str] = []
    for root in roots:
        _sweep(root, uid, max_depth, failed)
    return failed


def _sweep(directory: Path, uid: int, depth: int, failed: list[str]) -> None:
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if info.st_uid == uid:
            if not _remove(entry.path, info):
                failed.append(entry.path)
        elif depth > 0 and stat.S_ISDIR(info.st_mode) and info.st_mode & 0o022:
            # another owner's directory the uid may have written into (e.g. /tmp/.X11-unix)
            _sweep(Path(entry.path), uid, depth - 1, failed)


def _remove(path: str, info: os.stat_result) -> bool:
    try:
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return True
    except OSError:
        return not os.path.lexists(path)
    return True


def _proc_entries() -> list[str]:
    try:
        return [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _runs_as(pid: int, uid: int, setuid_root: bool = True) -> bool:
    """Whether the process runs as `uid` (effective or real) and is not a zombie."""
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return False
    if owner != uid and (owner != 0 or not setuid_root):
        # a process of another unprivileged user: its real uid could still be ours only through
        # a setuid program of that user, which the pool never has
        return False
    status = _read_status(pid)
    if status is None or b"\nState:\tZ" in status:
        return False
    if owner == uid:
        return True
    start = status.find(b"\nUid:\t")
    if start < 0:
        return False
    start += len(b"\nUid:\t")
    return status[start : status.find(b"\t", start)] == str(uid).encode()


def _read_status(pid: int) -> bytes | None:
    """`/proc/<pid>/status` by raw reads (a buffered file object per process costs more than
    the read: this runs over every root process of the node at each stop)."""
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def _kill(pid: int, uid: int) -> None:
    """SIGKILL `pid` only if it still runs as `uid` once pinned by a pidfd (no recycled pid)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if _runs_as(pid, uid):
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)
