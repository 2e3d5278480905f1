"""One pool user per live `local` runtime: two rollouts of a node cannot read each other.

The unit half drives `AgentPool` with made-up members (claims, re-claims, release, stale claims,
a busy pool); the real half starts runtimes on this node's pool users (scripts/bootstrap.sh makes
them) and has one agent try to read the other's workspace and process environment.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar_mq.config import get_settings
from polar_mq.evaluators import CommandEvaluator, EvalContext
from polar_mq.runtimes import LocalRuntime
from polar_mq.runtimes.agent_pool import AgentPool, pool_members
from polar_mq.runtimes.identity import AgentIdentity
from tests.conftest import runtime_id

MEMBERS = [AgentIdentity(70001 + i, 70000, f"polar-agent-{i + 1}") for i in range(2)]


def _runtime_dir(base: Path, name: str, uid: int | None = None) -> Path:
    path = base / name
    path.mkdir(parents=True)
    if uid is not None:
        (path / "runtime.json").write_text(
            json.dumps({"agent": {"uid": uid, "gid": 0, "name": "x"}})
        )
    return path


def test_each_runtime_gets_its_own_member_until_released(tmp_path: Path) -> None:
    pool = AgentPool(tmp_path / "claims", MEMBERS)
    a = _runtime_dir(tmp_path, "a")
    b = _runtime_dir(tmp_path, "b")
    first, second = pool.claim(a), pool.claim(b)
    assert first is not None and second is not None and first != second
    assert pool.claim(a) == first  # another stage of the same runtime: the same user
    assert pool.claim(_runtime_dir(tmp_path, "c")) is None  # busy: the caller shares
    assert first is not None
    pool.release(b, first.uid)  # not b's: nothing happens
    assert pool.claim(_runtime_dir(tmp_path, "d")) is None
    pool.release(a, first.uid)
    assert pool.claim(_runtime_dir(tmp_path, "e")) == first


def test_stale_claims_are_taken_over(tmp_path: Path) -> None:
    pool = AgentPool(tmp_path / "claims", MEMBERS)
    gone = _runtime_dir(tmp_path, "gone")
    moved = _runtime_dir(tmp_path, "moved")
    assert pool.claim(gone) == MEMBERS[0] and pool.claim(moved) == MEMBERS[1]
    shutil.rmtree(gone)  # its worker died before stop(); the janitor removed the directory
    (moved / "runtime.json").write_text(json.dumps({"agent": {"uid": 4321}}))
    assert pool.claim(_runtime_dir(tmp_path, "x")) == MEMBERS[0]
    assert pool.claim(_runtime_dir(tmp_path, "y")) == MEMBERS[1]
    # a runtime that exists but has not written its record yet is still starting: kept
    starting = _runtime_dir(tmp_path, "starting")
    fresh = AgentPool(tmp_path / "claims2", MEMBERS[:1])
    assert fresh.claim(starting) == MEMBERS[0]
    assert fresh.claim(_runtime_dir(tmp_path, "z")) is None


needs_pool = pytest.mark.skipif(
    os.geteuid() != 0 or len(pool_members()) < 2,
    reason="needs a root worker and two agent pool users (scripts/bootstrap.sh creates them)",
)


@pytest.fixture
def open_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    base = Path("/tmp") / f"pmq-pool-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    # The node's claims directory, as every other runtime of this node (the suite's other
    # workers') uses: a uid is the rollout's boundary and a stop kills every process of it, so a
    # private claims directory could hand these runtimes a uid another worker's runtime holds.
    monkeypatch.delenv("POLAR_MQ_AGENT_CLAIMS_DIR", raising=False)
    monkeypatch.delenv("POLAR_MQ_AGENT_USER", raising=False)
    get_settings.cache_clear()
    yield base / "runtimes"
    get_settings.cache_clear()
    shutil.rmtree(base, ignore_errors=True)


@needs_pool
def test_two_local_runtimes_cannot_read_each_other(open_root: Path) -> None:
    first = LocalRuntime(runtime_id("rt-pool-a"), open_root)
    second = LocalRuntime(runtime_id("rt-pool-b"), open_root)
    first.start()
    second.start()
    try:
        assert first.agent.name.startswith("polar-agent-")
        assert second.agent.name.startswith("polar-agent-")
        assert first.agent.uid != second.agent.uid
        first.upload(b"the answer is 42", "secret.txt")
        sleeper = first.exec(
            "(sleep 30 &) ; echo started", timeout=10
        )  # a background process of rollout A with A's environment
        assert sleeper.ok, sleeper
        victim = first.alive_processes()
        assert victim
        probe = second.exec(
            f"cat {first.workdir}/secret.txt 2>&1 || echo workspace-refused; "
            f"ls {first.workdir} > /dev/null 2>&1 || echo listing-refused; "
            f"cat /proc/{victim[0]}/environ > /dev/null 2>&1 || echo environ-refused; "
            f"kill -STOP {victim[0]} 2>/dev/null || echo signal-refused; "
            f"cat {first.path}/home/.x > /dev/null 2>&1; touch {first.path}/tmp/x 2>/dev/null "
            "|| echo tmp-refused"
        )
        lines = probe.stdout_tail.splitlines()
        assert "the answer is 42" not in probe.stdout_tail
        for expected in (
            "workspace-refused",
            "listing-refused",
            "environ-refused",
            "signal-refused",
            "tmp-refused",
        ):
            assert expected in lines, probe
        # its own workspace is fine
        assert first.exec("cat secret.txt").stdout_tail == "the answer is 42"
    finally:
        released = first.agent
        first.stop()
        second.stop()
    # the stopped runtimes' users go back to the pool (another worker of this node may take one
    # at once, so the claim is checked, not who takes the user next)
    holder = AgentPool(get_settings().agent_claims_dir, members=[]).holder(released.uid)
    assert holder != str(first.path)


@needs_pool
def test_a_grading_command_runs_as_the_runtimes_agent_never_root(open_root: Path) -> None:
    """The command evaluator runs in the workspace the agent controlled: as the agent's user, a
    link the agent planted cannot make it write a file the agent could not write itself."""
    rt = LocalRuntime(runtime_id("rt-pool-grade"), open_root)
    rt.start()
    guarded = open_root.parent / "worker-only.txt"  # the worker's file, not a system one
    guarded.write_text("untouched")
    guarded.chmod(0o644)
    try:
        assert rt.exec(f"ln -s {guarded} reward.txt").ok
        grader = CommandEvaluator("id -u > uid.txt; echo 1.0 > reward.txt", reward_file=None)
        result = grader.evaluate(
            EvalContext(
                rollout_id="r-1",
                task={},
                runtime=rt,
                workdir=rt.workdir,
                agent_exit_code=0,
                termination_reason="completed",
                final_text=None,
            )
        )
        assert result.reward == 0.0, result.detail  # the write through the link was refused
        assert (rt.workdir / "uid.txt").read_text().strip() == str(rt.agent.uid)
        assert rt.agent.uid != 0
        assert guarded.read_text() == "untouched"
    finally:
        rt.stop()


def test_pool_members_are_read_again_when_the_passwd_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The members are cached per passwd file version: a user added later is seen."""
    from polar_mq.runtimes import agent_pool

    passwd = tmp_path / "passwd"
    passwd.write_text("one\n")
    entries = [pwd.struct_passwd(("polar-agent-1", "x", 5001, 5001, "", "/", "/bin/sh"))]
    monkeypatch.setattr(agent_pool, "_PASSWD", str(passwd))
    monkeypatch.setattr(agent_pool, "_members_cache", None)
    monkeypatch.setattr(agent_pool.pwd, "getpwall", lambda: list(entries))
    assert [m.name for m in agent_pool.pool_members()] == ["polar-agent-1"]
    entries.append(pwd.struct_passwd(("polar-agent-2", "x", 5002, 5002, "", "/", "/bin/sh")))
    assert [m.name for m in agent_pool.pool_members()] == ["polar-agent-1"]  # cached
    passwd.write_text("one\ntwo\n")
    assert [m.name for m in agent_pool.pool_members()] == ["polar-agent-1", "polar-agent-2"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process as another uid")
def test_a_free_user_is_handed_out_only_once_its_leftover_processes_are_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A holder that never stopped (its worker was killed) left a process under the uid: the
    claim kills it first; one that survives SIGKILL quarantines the uid for good."""
    from polar_mq.runtimes import agent_pool, uid_sweep

    # a uid of its own: no real user has it, and no other test's claim (which would kill this
    # test's processes as leftovers, from another xdist worker) hands it out
    member = AgentIdentity(70101, 70100, "polar-agent-sweep")
    leftover = subprocess.Popen(["sleep", "60"], user=member.uid, group=member.gid)
    try:
        assert uid_sweep.pids_of(member.uid) == [leftover.pid]
        pool = AgentPool(tmp_path / "claims", [member])
        assert pool.claim(_runtime_dir(tmp_path, "next")) == member
        assert leftover.wait(timeout=10) == -9
        pool.release(tmp_path / "next", member.uid)

        unkillable = subprocess.Popen(["sleep", "60"], user=member.uid, group=member.gid)
        monkeypatch.setattr(agent_pool.uid_sweep, "kill_uid", lambda uid, deadline_s: [1234])
        assert pool.claim(_runtime_dir(tmp_path, "after")) is None
        assert pool.holder(member.uid) == agent_pool.QUARANTINE
        unkillable.kill()
        unkillable.wait()
        assert pool.claim(_runtime_dir(tmp_path, "later")) is None  # until an operator looks
    finally:
        leftover.kill()
        leftover.wait()
