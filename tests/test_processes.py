"""Stopping child process groups: every member goes, the leader's children included."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from polar_mq.processes import ManagedProcess, group_exists, live_groups, stop_all

# A leader with two children of its own (like a server and its prefork workers).
TREE = "import subprocess, sys; [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']) for _ in range(2)]; import time; time.sleep(60)"  # noqa: E501


def _tree(name: str, tmp_path: Path) -> ManagedProcess:
    return ManagedProcess(name, [sys.executable, "-c", TREE], {}, tmp_path).start()


def _members_at_least(procs: list[ManagedProcess], n: int) -> dict[int, list[int]]:
    deadline = time.monotonic() + 20
    while True:
        groups = live_groups([p.pid for p in procs])
        if all(len(groups.get(p.pid, [])) >= n for p in procs):
            return groups
        assert time.monotonic() < deadline, f"the trees did not start: {groups}"
        time.sleep(0.05)


def test_live_groups_lists_each_groups_members(tmp_path: Path) -> None:
    procs = [_tree("a", tmp_path), _tree("b", tmp_path)]
    try:
        groups = _members_at_least(procs, 3)
        for p in procs:
            assert p.pid in groups[p.pid]  # the leader leads its own group
        assert set(groups[procs[0].pid]).isdisjoint(groups[procs[1].pid])
    finally:
        stop_all(procs)


def test_stop_all_leaves_no_member_of_any_group(tmp_path: Path) -> None:
    procs = [_tree("a", tmp_path), _tree("b", tmp_path)]
    _members_at_least(procs, 3)
    stop_all(procs, grace_s=10)
    assert live_groups([p.pid for p in procs]) == {}
    assert all(not p.alive() for p in procs)
    stop_all(procs)  # safe to repeat


def test_a_group_exists_until_its_last_member_is_gone(tmp_path: Path) -> None:
    """What a stop polls between its /proc walks: the kernel's answer for the whole group."""
    (proc,) = procs = [_tree("a", tmp_path)]
    _members_at_least(procs, 3)
    assert group_exists(proc.pid)
    stop_all(procs, grace_s=10)
    # the children died orphans: the group lasts until init has reaped their zombies too (this
    # machine's init takes about a second), which is why a stop also walks /proc now and then
    deadline = time.monotonic() + 20
    while group_exists(proc.pid):
        assert time.monotonic() < deadline, "the group outlived its members by 20 s"
        time.sleep(0.05)
