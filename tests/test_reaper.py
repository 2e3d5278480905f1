"""The reaper stops the groups of a dead pytest's processes, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from tests.reaper import OWNER_VAR, owner_alive, owner_tag, reap_orphans

# One worker for the module: two of its tests each plant a dead owner's orphans, and a reap in
# one would kill the other's before that one's own reap could report it.
pytestmark = pytest.mark.xdist_group("reaper")


def _sleeper(tag: str) -> subprocess.Popen[bytes]:
    """A process in a group of its own, tagged as started by `tag`'s owner (like a stack's)."""
    env = {**os.environ, OWNER_VAR: tag}
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    deadline = time.monotonic() + 10
    while psutil.Process(proc.pid).environ().get(OWNER_VAR) != tag:  # until it has exec'd
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return proc


def test_orphans_of_a_dead_owner_are_killed_and_a_live_owners_are_kept() -> None:
    dead_owner = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_tag = owner_tag(dead_owner.pid)
    dead_owner.wait()
    assert not owner_alive(dead_tag) and owner_alive(owner_tag())
    orphan, kept = _sleeper(dead_tag), _sleeper(owner_tag())
    try:
        assert orphan.pid in reap_orphans()
        assert orphan.wait(10) == -9
        assert kept.poll() is None
    finally:
        for proc in (orphan, kept):
            proc.kill()
            proc.wait()


def test_another_checkouts_orphans_are_left_alone() -> None:
    dead_owner = subprocess.Popen([sys.executable, "-c", "pass"])
    tag = "/elsewhere|" + owner_tag(dead_owner.pid).rsplit("|", 2)[1] + "|1.000"
    dead_owner.wait()
    other = _sleeper(tag)
    try:
        assert other.pid not in reap_orphans()
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_group_whose_leader_is_an_orphan_goes_whole() -> None:
    """vLLM's engine processes overwrite their environment (setproctitle): the leader's tag
    decides for its group."""
    dead_owner = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_tag = owner_tag(dead_owner.pid)
    dead_owner.wait()
    child = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env={}); "
        "time.sleep(60)"
    )
    env = {**os.environ, OWNER_VAR: dead_tag}
    leader = subprocess.Popen([sys.executable, "-c", child], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(leader.pid).children():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (untagged,) = psutil.Process(leader.pid).children()
        assert leader.pid in reap_orphans()
        assert leader.wait(10) == -9
        untagged.wait(10)
    finally:
        leader.kill()
        leader.wait()
