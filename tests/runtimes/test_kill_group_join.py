"""A command that needs nothing before exec but its kill group joins it through a shell, so the
worker spawns it without a `preexec_fn` (which would fork the whole worker); the guarantee stays:
the program runs inside the group, a failed join is the platform's error and never the agent's
exit, and the agent never holds the pipe that reports it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from polar_mq.runtimes import LocalRuntime, ResourceLimits, host_exec, kill_group
from polar_mq.runtimes.base import ExecRequest
from polar_mq.runtimes.host_exec import HostLaunch, run_on_host
from polar_mq.runtimes.identity import worker_identity
from tests.conftest import runtime_id

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or kill_group.base_dir() is None,
    reason="needs a root worker and a writable cgroup v2 hierarchy",
)


@pytest.fixture
def spawns(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of every `Popen` the runtime makes."""
    seen: list[dict[str, Any]] = []
    real = subprocess.Popen

    def recording(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(host_exec.subprocess, "Popen", recording)
    return seen


@contextmanager
def _runtime(tmp_path: Path, limits: ResourceLimits | None = None) -> Iterator[LocalRuntime]:
    rt = LocalRuntime(runtime_id("rt-join"), tmp_path / "runtimes", limits, agent=worker_identity())
    rt.start()
    try:
        yield rt
    finally:
        rt.stop()


@pytest.fixture
def shared_uid(tmp_path: Path) -> Iterator[LocalRuntime]:
    """Agents as the worker itself: no uid to sweep, so the runtime has a kill group."""
    with _runtime(tmp_path) as rt:
        yield rt


def _group_of(listing: str) -> str:
    (line,) = [x for x in listing.splitlines() if x.startswith("0::")]
    return line.removeprefix("0::")


def test_the_program_runs_in_its_group_spawned_without_a_fork(
    shared_uid: LocalRuntime, spawns: list[dict[str, Any]]
) -> None:
    group = kill_group.group_for(shared_uid.runtime_id, shared_uid.root)
    assert group is not None and group.is_dir()
    joined = shared_uid.exec(["cat", "/proc/self/cgroup"])
    assert joined.ok and group.as_posix().endswith(_group_of(joined.stdout_tail)), joined
    # the program holds stdin, stdout, stderr (and `ls` the directory it lists): no status pipe
    fds = shared_uid.exec(["ls", "/proc/self/fd"])
    assert fds.ok and sorted(map(int, fds.stdout_tail.split())) == [0, 1, 2, 3], fds
    assert [s["preexec_fn"] for s in spawns] == [None, None]


def test_a_command_with_limits_still_joins_before_they_apply(tmp_path: Path) -> None:
    with _runtime(tmp_path, ResourceLimits(max_open_files=64)) as rt:
        result = rt.exec(["/bin/sh", "-c", "cat /proc/self/cgroup; ulimit -n"])
        assert result.ok, result
        group = kill_group.group_for(rt.runtime_id, rt.root)
        assert group is not None and group.as_posix().endswith(_group_of(result.stdout_tail))
        assert result.stdout_tail.split()[-1] == "64"


def test_a_failed_join_is_the_platforms_error_and_the_program_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    launch = HostLaunch(
        runtime_id="rt-join-missing", base_env={"PATH": os.environ["PATH"]}, cwd=tmp_path,
        limits=None, user=None, kill_grace_s=0.3, drain_s=0.1,
        cgroup_procs=str(tmp_path / "no-such-group" / "cgroup.procs"),
    )  # fmt: skip
    request = ExecRequest(["/bin/sh", "-c", f"touch {marker}"])
    with pytest.raises(RuntimeError, match="cannot join the kill group"):
        run_on_host(request.argv, request, launch)
    assert not marker.exists()


def test_a_missing_program_is_an_exit_of_127(shared_uid: LocalRuntime) -> None:
    missing = shared_uid.exec(["/no/such/program"])
    assert missing.exit_code == 127 and "no/such/program" in missing.stderr_tail
