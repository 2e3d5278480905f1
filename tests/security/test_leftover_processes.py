"""No process of a rollout outlives its runtime's stop, and nothing it left in /tmp does either.

The attack (issue 32): under `local`, an agent started a daemon with `env -i`, which the stop's
environment-tag kill could not find. Its pool uid went to another tenant's next runtime, and the
daemon read that agent's environment (the rollout token) from `/proc/<pid>/environ`. Here each
runtime kind gets, through its own `exec` as an agent would, an `env -i` daemon and a
double-forked `setsid` daemon that loop every 50 ms; after `stop()` no process of the node still
runs either (found by a token in their argv, whatever their environment or session). Under
`local` the next runtime is forced onto the same pool uid: no process of the uid is alive when it
starts, the daemons' marker stopped growing, and they never read its agent's environment. Files
the agent wrote to `/tmp`, `/dev/shm` and `/var/tmp` are not on the node after the stop.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from polar_mq.config import get_settings
from polar_mq.runtimes import LocalRuntime, Runtime, kill_group, private_view, uid_sweep
from polar_mq.runtimes.agent_pool import AgentPool, pool_members
from polar_mq.runtimes.identity import parse_agent_user
from tests.conftest import runtime_id
from tests.runtimes.runtime_backends import KINDS, backend_for

pytestmark = [pytest.mark.e2e]

SHARED_TMP = ("/tmp", "/dev/shm", "/var/tmp")

needs_pool = pytest.mark.skipif(
    os.geteuid() != 0 or not pool_members(),
    reason="needs a root worker and agent pool users (scripts/bootstrap.sh creates them)",
)


def _loop(token: str, markers: str | None) -> str:
    """A shell loop carrying `token` in its argv; with `markers`, it ticks a file there every
    50 ms and records any process environment holding the victim's secret it can read."""
    body = f": {token}; "
    if markers is not None:
        body += (
            f"echo t >> {markers}/ticks-$$; "
            f"grep -l -s VICTIM_SECRET_{token} /proc/[0-9]*/environ >> {markers}/stolen; "
        )
    return f"while :; do {body}sleep 0.05; done"


def _plant(rt: Runtime, token: str, markers: str | None = None) -> None:
    """The two daemons, started through the runtime's exec as the agent would."""
    loop = _loop(token, markers)
    quiet = "</dev/null >/dev/null 2>&1"
    command = (
        f"env -i /bin/sh -c '{loop}' {quiet} & "
        f"( setsid /bin/sh -c '{loop}' {quiet} & ) ; "
        "sleep 0.3; echo planted"
    )
    result = rt.exec(command, timeout=30)
    assert result.ok and "planted" in result.stdout_tail, result


def _running(token: str) -> list[int]:
    """Pids of this node's processes whose argv holds `token` (in any namespace or container)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(token in part for part in proc.info["cmdline"] or ()):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A directory outside every path the local view hides or replaces (the checkout, the
    runtime root, /tmp): the daemons' markers stay visible to the test after the stop."""
    base = Path("/run") / f"pmq-leftover-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o755)
    (base / "markers").mkdir()
    (base / "markers").chmod(0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("kind", KINDS)
def test_daemons_die_with_the_runtime(kind: str, open_base: Path) -> None:
    """`env -i` and double-forked `setsid` daemons are gone once `stop()` returns."""
    token = f"leftover{uuid.uuid4().hex[:10]}"
    with backend_for(kind, open_base / "runtimes") as backend:
        rt = backend.make("leftover")
        rt.start()
        _plant(rt, token)
        rt.stop()
        assert _running(token) == []


def test_local_daemons_on_a_shared_agent_user_die_with_the_runtime(open_base: Path) -> None:
    """The node's shared agent user (the pool was busy, or `agent_user` is set) cannot be swept
    by uid, other runtimes run as it too: the runtime's kill group finds the daemons."""
    if os.geteuid() != 0 or kill_group.base_dir() is None:
        pytest.skip("needs a root worker and a writable cgroup v2 hierarchy")
    shared = parse_agent_user(None)  # polar-agent, else nobody: never a pool user
    token = f"leftover{uuid.uuid4().hex[:10]}"
    rt = LocalRuntime(runtime_id("rt-leftover-shared"), open_base / "runtimes", agent=shared)
    rt.start()
    try:
        assert rt.agent == shared
        _plant(rt, token)
    finally:
        rt.stop()
    assert _running(token) == []


@needs_pool
def test_local_uid_goes_to_the_next_runtime_without_a_live_process(open_base: Path) -> None:
    """Runtime 1 plants the daemons and stops; runtime 2 gets the same pool uid: no process of
    the uid is alive, the daemons' marker no longer grows, and they never read runtime 2's
    agent environment."""
    root = open_base / "runtimes"
    markers = open_base / "markers"
    token = f"leftover{uuid.uuid4().hex[:10]}"
    first = LocalRuntime(runtime_id("rt-leftover-a"), root)
    first.start()
    agent = first.agent
    try:
        assert agent.name.startswith("polar-agent-"), agent
        _plant(first, token, str(markers))
        assert list(markers.glob("ticks-*")), "the daemons never ran"
    finally:
        first.stop()
    assert uid_sweep.pids_of(agent.uid) == []
    ticks = {p: p.stat().st_size for p in markers.glob("ticks-*")}
    second = LocalRuntime(runtime_id("rt-leftover-b"), root, agent=agent)
    # forced onto the same uid, through the pool's own check (a pool of that one user), so that
    # other runtimes of the node see it taken
    pool = AgentPool(get_settings().agent_claims_dir, members=[agent])
    if pool.claim(second.path) != agent:
        pytest.skip(f"{agent.name} was taken by another runtime of this node meanwhile")
    second.start()
    try:
        assert second.agent.uid == agent.uid
        assert uid_sweep.pids_of(agent.uid) == []  # nothing of runtime 1 as the uid is reused
        victim = second.exec("sleep 0.5", env={f"VICTIM_SECRET_{token}": "the rollout token"})
        assert victim.ok, victim
        # six ticks of a surviving daemon's loop later: the markers have not moved
        assert {p: p.stat().st_size for p in markers.glob("ticks-*")} == ticks
        stolen = markers / "stolen"
        assert not stolen.exists() or stolen.read_text() == ""
    finally:
        second.stop()
    assert _running(token) == []


@pytest.mark.parametrize("kind", KINDS)
def test_agent_temp_files_do_not_outlive_the_runtime(kind: str, open_base: Path) -> None:
    """What the agent wrote to /tmp, /dev/shm and /var/tmp is not on the node after stop (under
    `local` it never was: each command gets its own; else the stop removes the uid's files)."""
    name = f"pmq-leftover-{uuid.uuid4().hex[:10]}"
    paths = [f"{directory}/{name}" for directory in SHARED_TMP]
    with backend_for(kind, open_base / "runtimes") as backend:
        rt = backend.make("tmpfiles")
        rt.start()
        writes = "; ".join(f"echo secret > {path} 2>/dev/null" for path in paths)
        result = rt.exec(f"{writes}; cat {paths[0]}", timeout=30)
        assert result.ok and "secret" in result.stdout_tail, result  # it could write /tmp
        if kind != "local" or private_view.unavailable_reason() is None:
            # never on the node: the command had its own (a tmpfs of its view or sandbox)
            assert [path for path in paths if os.path.lexists(path)] == []
        rt.stop()
    assert [path for path in paths if os.path.lexists(path)] == []


def test_files_of_a_pool_uid_are_removed_from_shared_temp_dirs(tmp_path: Path) -> None:
    """The stop's sweep where the node has no private view: every entry the uid owns, also
    inside another owner's writable directory; nothing of another owner, no link followed."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give files to another uid")
    uid = 70123
    shared = tmp_path / "tmp"
    other = shared / ".X11-unix"
    other.mkdir(parents=True)
    other.chmod(0o1777)
    keep = shared / "someone-elses"
    keep.write_text("kept")
    outside = tmp_path / "outside.txt"
    outside.write_text("never followed")
    owned = [shared / "mine.txt", shared / "mydir", other / "inside", shared / "link"]
    owned[0].write_text("x")
    (owned[1] / "deep").mkdir(parents=True)
    owned[2].write_text("x")
    owned[3].symlink_to(outside)
    for path in [owned[1] / "deep", *owned]:
        os.lchown(path, uid, uid)
    assert uid_sweep.remove_files_of(uid, roots=(shared,)) == []
    assert [p for p in owned if os.path.lexists(p)] == []
    assert keep.read_text() == "kept" and outside.read_text() == "never followed"
    assert other.is_dir()


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.mark.parametrize("kind", KINDS)
def test_a_reset_runtime_keeps_nothing_of_its_last_rollout(kind: str, open_base: Path) -> None:
    """The warm pool hands a reset runtime to the next rollout: the daemons are gone and the
    files the last agent left in /tmp, /dev/shm and /var/tmp are not there for the next one."""
    token = f"leftover{uuid.uuid4().hex[:10]}"
    name = f"pmq-leftover-{uuid.uuid4().hex[:10]}"
    paths = [f"{directory}/{name}" for directory in SHARED_TMP]
    with backend_for(kind, open_base / "runtimes") as backend:
        rt = backend.make("reset")
        rt.start()
        _plant(rt, token)
        writes = "; ".join(f"echo secret > {path} 2>/dev/null" for path in paths)
        assert rt.exec(f"{writes}; cat {paths[0]}", timeout=30).stdout_tail == "secret\n"
        rt.reset()
        assert _running(token) == []
        looked = rt.exec(f"cat {' '.join(paths)} 2>/dev/null; echo looked", timeout=30)
        assert looked.stdout_tail == "looked\n", looked
