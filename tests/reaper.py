"""Stop the test stacks a killed pytest left behind.

A stack's services run in process groups of their own (`ManagedProcess`: `start_new_session`), so
when a pytest process dies without its teardown (SIGKILL, a CI timeout, a closed terminal) its
proxies, workers and APIs live on, each holding PostgreSQL connections, until the machine runs out
of them. Every process a test session starts inherits `OWNER_VAR` (this checkout, the pytest
process's pid and start time); at the start of the next session, the groups whose owner is gone
are killed. Only this checkout's orphans: another checkout's processes are not ours to stop.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import psutil

OWNER_VAR = "POLAR_MQ_TEST_OWNER"
ROOT = str(Path(__file__).resolve().parents[1])


def owner_tag(pid: int | None = None) -> str:
    """The tag of the live process `pid` (default: this one): checkout, pid, start time."""
    proc = psutil.Process(pid or os.getpid())
    return f"{ROOT}|{proc.pid}|{proc.create_time():.3f}"


def owner_alive(tag: str) -> bool:
    """Whether the process a tag names still runs (the same one: a reused pid does not count)."""
    try:
        _, pid, started = tag.rsplit("|", 2)
        return f"{psutil.Process(int(pid)).create_time():.3f}" == started
    except (ValueError, psutil.Error):
        return False


def mark_owner() -> None:
    """Tag this process's environment, so that every child it starts carries the tag."""
    os.environ[OWNER_VAR] = owner_tag()


def reap_orphans() -> list[int]:
    """Kill the process groups of this checkout's test processes whose owning pytest is gone;
    return the killed group ids. A group is killed when its leader carries such a tag (a group
    a test started: `ManagedProcess`, vLLM), or, leaderless, when every member does; never a
    group shared with a shell or a CI runner. (Members may hide their environment: vLLM's
    `setproctitle` overwrites it.)"""
    members: dict[int, bool] = {}  # process group -> every member so far is an orphan
    leaders: dict[int, bool] = {}  # process group -> its leader is an orphan
    for proc in psutil.process_iter():
        try:
            group = os.getpgid(proc.pid)
            tag = proc.environ().get(OWNER_VAR, "")
        except (psutil.Error, OSError):
            continue
        orphan = tag.startswith(ROOT + "|") and not owner_alive(tag)
        members[group] = members.get(group, True) and orphan
        if proc.pid == group:
            leaders[group] = orphan
    groups = sorted(g for g in members if leaders.get(g, members[g]) and g != os.getpgrp())
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    return groups
