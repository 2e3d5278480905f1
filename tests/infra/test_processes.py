"""Stopping child process groups: every member goes, the leader's children included."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from polar_mq.infra.processes import ManagedProcess, group_exists, live_groups, stop_all

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


# A service whose warm shutdown takes a while: SIGTERM makes it exit after 1 s.
SLOW_TO_STOP = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0))); print('re' + 'ady', flush=True); time.sleep(60)"  # noqa: E501


def test_a_second_stop_signal_does_not_cut_a_stop_short(tmp_path: Path) -> None:
    """The demo and the vLLM CLI raise on SIGTERM; another one during their stop (a supervisor
    forwarding signals, a second Ctrl-C) raised out of `stop_all` before its SIGKILL, which
    could leave a service running. It is ignored while the stop runs, then the handler is back."""
    proc = ManagedProcess("slow", [sys.executable, "-c", SLOW_TO_STOP], {}, tmp_path).start()
    log = proc.log_path
    deadline = time.monotonic() + 20
    while "\nready\n" not in (log.read_text() if log.exists() else ""):  # its handler is set
        assert time.monotonic() < deadline, "the service did not start"
        time.sleep(0.05)

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    sender = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        sender.start()
        try:
            stop_all([proc], grace_s=5.0)
        except KeyboardInterrupt:
            pytest.fail("the second SIGTERM raised out of the stop")
        assert not proc.alive() and not group_exists(proc.pid)
        assert signal.getsignal(signal.SIGTERM) is interrupt  # restored after the stop
    finally:
        sender.cancel()
        signal.signal(signal.SIGTERM, previous)
        stop_all([proc])
