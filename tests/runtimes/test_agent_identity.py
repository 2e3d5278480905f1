"""Who agent commands run as: parsing `POLAR_MQ_AGENT_USER`, and each runtime applying it.

Real processes: the runtimes start real commands that report their own ids and try the worker's
environment. Runtime roots live below a directory every user may enter (pytest's own temporary
root is private), except in the test of the development fallback, which needs exactly that.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar_mq.config import get_settings
from polar_mq.runtimes import LocalRuntime
from polar_mq.runtimes.bwrap import BwrapRuntime, bwrap_available
from polar_mq.runtimes.identity import (
    NOBODY,
    AgentIdentity,
    can_reach,
    parse_agent_user,
    worker_identity,
)
from tests.conftest import runtime_id

AGENT = AgentIdentity(NOBODY, NOBODY, "nobody")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs a root worker")


@pytest.fixture
def open_root() -> Iterator[Path]:
    base = Path("/tmp") / f"pmq-identity-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    yield base / "runtimes"
    shutil.rmtree(base, ignore_errors=True)


def test_parse_agent_user() -> None:
    nobody = pwd.getpwnam("nobody")
    assert parse_agent_user("nobody") == AgentIdentity(nobody.pw_uid, nobody.pw_gid, "nobody")
    assert parse_agent_user("4321") == AgentIdentity(4321, 4321, "4321")
    assert parse_agent_user("4321:99").gid == 99
    default = parse_agent_user(None)
    assert default.uid != 0 and default.name in ("polar-agent", "nobody")
    for root in ("root", "0", "1000:0"):
        with pytest.raises(ValueError, match="must not be root"):
            parse_agent_user(root)
    with pytest.raises(ValueError, match="does not exist"):
        parse_agent_user("no-such-user-here")


def test_can_reach_follows_every_parent(tmp_path: Path) -> None:
    private = tmp_path / "private"
    (private / "inner").mkdir(parents=True)
    private.chmod(0o700)
    assert can_reach(private / "inner", worker_identity())
    stranger = AgentIdentity(4321, 4321, "stranger")
    assert not can_reach(private / "inner", stranger)
    private.chmod(0o711)
    assert can_reach(private / "inner", stranger) == can_reach(tmp_path, stranger)


@as_root
def test_local_runs_commands_as_the_agent_who_owns_the_workspace(open_root: Path) -> None:
    rt = LocalRuntime(runtime_id("rt-agent"), open_root, agent=AGENT)
    rt.start()
    try:
        rt.upload(b"task", "deep/dir/task.json")
        result = rt.exec(
            f"id -u; id -g; id -G; cat deep/dir/task.json; echo; touch deep/dir/mine; "
            f"cat /proc/{os.getpid()}/environ > /dev/null 2>&1 || echo environ-refused; "
            f"ls {open_root} > /dev/null 2>&1 || echo root-unlisted"
        )
        assert result.ok, result
        assert result.stdout_tail.splitlines() == [
            str(NOBODY),
            str(NOBODY),
            str(NOBODY),
            "task",
            "environ-refused",
            "root-unlisted",
        ]
        assert (rt.workdir / "deep" / "dir" / "mine").stat().st_uid == NOBODY
        # a handle made later (another stage) runs as the identity recorded at start
        again = LocalRuntime(runtime_id("rt-agent"), open_root)
        assert again.agent == AGENT
        assert again.exec("id -u").stdout_tail.strip() == str(NOBODY)
    finally:
        rt.stop()


@as_root
def test_hand_over_gives_worker_files_to_the_agent(open_root: Path) -> None:
    rt = LocalRuntime(runtime_id("rt-hand"), open_root, agent=AGENT)
    rt.start()
    try:
        (rt.workdir / "repo" / "src").mkdir(parents=True)
        (rt.workdir / "repo" / "src" / "a.py").write_text("x = 1\n")
        assert rt.exec("echo y >> repo/src/a.py").exit_code != 0  # still the worker's
        rt.hand_over()
        assert rt.exec("echo y >> repo/src/a.py && mkdir repo/new").ok
    finally:
        rt.stop()


@as_root
def test_unreachable_root_is_refused_unless_root_agents_are_opted_into(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below a private directory the agent user could not open its own files. The runtime never
    silently falls back to the worker (root: a grading command would then write through an
    agent's links as root); only the explicit development switch runs agents as the worker."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("POLAR_MQ_UNSAFE_ROOT_AGENTS", "0")
    get_settings.cache_clear()
    refused = LocalRuntime(f"rt-priv-{uuid.uuid4().hex[:6]}", private, agent=AGENT)
    with pytest.raises(RuntimeError, match="not reachable by the agent user"):
        refused.start()
    refused.stop()

    monkeypatch.setenv("POLAR_MQ_UNSAFE_ROOT_AGENTS", "1")
    get_settings.cache_clear()
    rt = LocalRuntime(f"rt-priv-{uuid.uuid4().hex[:6]}", private, agent=AGENT)
    with caplog.at_level(logging.WARNING):
        rt.start()
    try:
        assert rt.agent == worker_identity()
        assert any("UNSAFE_ROOT_AGENTS" in r.message for r in caplog.records)
    finally:
        rt.stop()
        get_settings.cache_clear()


@as_root
def test_bwrap_runs_commands_as_the_agent_without_capabilities(open_root: Path) -> None:
    reason = bwrap_available()
    if reason is not None:
        pytest.skip(reason)
    rt = BwrapRuntime(runtime_id("rt-bw-agent"), open_root, agent=AGENT)
    rt.start()
    try:
        rt.upload(b"task", "task.json")
        result = rt.exec("id -u; grep -E 'Cap(Eff|Prm)' /proc/self/status; cat task.json; touch x")
        assert result.ok, result
        lines = result.stdout_tail.splitlines()
        assert lines[0] == str(NOBODY)
        assert [line.split()[1] for line in lines[1:3]] == ["0000000000000000"] * 2
        assert lines[3] == "task"
        assert (rt.workdir / "x").stat().st_uid == NOBODY
    finally:
        rt.stop()


@as_root
def test_an_agent_link_never_hands_it_the_runtime_records(open_root: Path) -> None:
    """The worker writing through a link the agent planted must not give it `runtime.json`
    (which names the user commands run as)."""
    rt = LocalRuntime(runtime_id("rt-link"), open_root, agent=AGENT)
    rt.start()
    try:
        assert rt.exec("ln -s ../runtime.json planted").ok
        with pytest.raises(ValueError, match=r"outside workspace|is a symlink"):
            rt.upload(b'{"agent": {"uid": 0, "gid": 0, "name": "root"}}', "planted")
        assert rt.agent == AGENT and (rt.path / "runtime.json").stat().st_uid == 0
        assert rt.exec("echo x > ../runtime.json").exit_code != 0  # not the agent's to write
        assert rt.exec("id -u").stdout_tail.strip() == str(NOBODY)
    finally:
        rt.stop()
