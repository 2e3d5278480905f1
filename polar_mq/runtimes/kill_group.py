"""A cgroup v2 group per `local` runtime, so that `stop()` kills every process the agent started.

The environment tag misses a process that re-executed itself with `env -i`; a double fork with
`setsid`, a renamed argv or closed descriptors do not matter either: the kernel puts every child in
its parent's cgroup and an unprivileged process cannot leave it (the group's files are root's).
Each command joins the group before it becomes the agent (`joining_argv`, or `join_in_child`
in a forked child that also applies rlimits or switches users), and the stop writes `cgroup.kill`
(Linux 5.14+; else SIGKILL to each member until the group is empty).

Only the core v2 files are used (no controller), so the unified hierarchy of a hybrid node
(`/sys/fs/cgroup/unified`) serves as well as a pure v2 one. Where there is none, or the worker may
not write it (not root, a read-only cgroup file system), `available()` says why and `local` relies
on the tag scan plus the pool uid sweep (`uid_sweep`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
from functools import lru_cache
from pathlib import Path

from polar_mq.runtimes import cgroups

V2_MOUNTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
PARENT = "polar_mq_local"


@lru_cache(maxsize=1)
def base_dir() -> Path | None:
    """The directory holding the groups on this node; None when no writable v2 hierarchy."""
    for mount in V2_MOUNTS:
        if not (mount / "cgroup.controllers").exists():
            continue
        base = mount / PARENT
        try:
            base.mkdir(exist_ok=True)
            probe = base / f"probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
            probe.rmdir()
        except OSError:
            continue
        return base
    return None


def group_for(runtime_id: str, root: Path) -> Path | None:
    """The group of the runtime `runtime_id` under `root` (unique per root), None without v2."""
    base = base_dir()
    if base is None:
        return None
    digest = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:10]
    return base / f"{runtime_id}-{digest}"


def create(group: Path) -> None:
    group.mkdir(exist_ok=True)


def procs_file(group: Path | None) -> str | None:
    """The file a command's child writes itself into; None when the group does not exist (a
    runtime started before groups, or a node without them)."""
    if group is None:
        return None
    procs = group / "cgroup.procs"
    return str(procs) if procs.exists() else None


JOIN_SCRIPT = (
    'if ! echo 0 2>/dev/null >"$0"; then echo "cannot join the kill group $0" >&0; exit 126; fi;'
    ' exec "$@" </dev/null'
)
"""`sh -c JOIN_SCRIPT PROCS ARGV...` with a status pipe's writing end as stdin: join, then exec
ARGV on an empty stdin (dash cannot name a descriptor above 9, stdin it can)."""


def joining_argv(procs: str, argv: list[str]) -> list[str]:
    """`argv` behind a shell that joins the group first, for a command that needs nothing else
    done before exec. The worker then spawns it without a Python `preexec_fn`, which would make
    `subprocess` fork the whole worker (copying its page tables, then faulting on every page it
    writes while the child lives) instead of `vfork` it; the shell costs the child one small
    exec. A failed join is reported on the shell's stdin (`status_pipe`), never run as the
    agent, and the agent never holds that pipe."""
    return ["/bin/sh", "-c", JOIN_SCRIPT, procs, *argv]


def join_in_child(procs: str) -> None:
    """Move the calling process into the group (run in the forked child, before exec)."""
    fd = os.open(procs, os.O_WRONLY)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


def members(group: Path | None) -> list[int]:
    if group is None:
        return []
    try:
        return [int(line) for line in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def kill(group: Path | None, deadline_s: float = 10.0) -> list[int]:
    """Kill every member until the group is empty; return the pids left at the deadline."""
    if group is None or not group.is_dir():
        return []
    end = time.monotonic() + deadline_s
    killer = group / "cgroup.kill"
    while True:
        left = members(group)
        if not left:
            return []
        if time.monotonic() >= end:
            return left
        try:
            killer.write_text("1")
        except OSError:  # before Linux 5.14: one by one (children of a forker show up next time)
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def remove(group: Path | None, timeout: float = 5.0) -> None:
    """Delete the (empty) group; its last members may take a moment to leave."""
    if group is not None:
        cgroups.remove(group, timeout)
