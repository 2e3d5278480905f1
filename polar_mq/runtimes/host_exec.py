"""Run one tagged command as a process of this node, and kill every process of a runtime.

`local` runs a request's argv here directly, `bwrap` runs its bubblewrap wrapper around it here:
both start a session whose processes carry the runtime's and the exec's tags (`process_kit`),
supervise it (deadline, inactivity) and kill its whole tree on expiry. `docker` runs its commands
through the engine instead (`docker_exec.py`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from polar_mq.runtimes.base import ExecRequest, ExecResult, ResourceLimits
from polar_mq.runtimes.identity import AgentIdentity
from polar_mq.runtimes.kill_group import join_in_child, joining_argv
from polar_mq.runtimes.process_kit import (
    EXEC_TAG,
    RUNTIME_TAG,
    Supervisor,
    kill_tree,
    open_sink,
    rlimit_setter,
    signal_all,
    tagged_processes,
    wait_gone,
)
from polar_mq.runtimes.status_pipe import status_channel


@dataclass(frozen=True, slots=True)
class HostLaunch:
    """How a runtime starts a request's process: `kill_grace_s` is how long an expired command
    gets between SIGTERM and SIGKILL; `drain_s` how long output is still collected after the
    command exited while a background child keeps its pipes open. `user` None: the worker's.
    `pass_fds`: descriptors the command inherits (the `local` view helper's status pipe).
    `cgroup_procs`: the `cgroup.procs` file of the runtime's kill group (`kill_group`), which
    the child joins before it becomes `user`, so that nothing it starts can leave the group."""

    runtime_id: str
    base_env: Mapping[str, str]
    cwd: Path
    limits: ResourceLimits | None
    user: AgentIdentity | None
    kill_grace_s: float
    drain_s: float
    pass_fds: tuple[int, ...] = ()
    cgroup_procs: str | None = None


def run_on_host(argv: list[str], request: ExecRequest, launch: HostLaunch) -> ExecResult:
    """Run `argv` (the request's, or a sandbox around it) with the request's env, clocks, log."""
    procs = launch.cgroup_procs
    if procs is None or not _only_joins(launch):
        return _run(argv, request, launch)
    with status_channel() as status:  # the join is all the child needs: a shell does it
        joined = replace(launch, cgroup_procs=None)
        result = _run(joining_argv(procs, argv), request, joined, stdin=status.fd)
        failure = status.failure()
    if failure is not None:  # the platform's failure: never scored as the agent's exit
        raise RuntimeError(f"runtime {launch.runtime_id}: {failure}")
    return result


def _run(
    argv: list[str], request: ExecRequest, launch: HostLaunch, stdin: int = subprocess.DEVNULL
) -> ExecResult:
    exec_id = uuid.uuid4().hex
    full_env = {**launch.base_env, **request.env, RUNTIME_TAG: launch.runtime_id}
    full_env[EXEC_TAG] = exec_id
    user = launch.user
    preexec = child_setup(launch)
    popen_user = user if launch.cgroup_procs is None else None  # else `child_setup` switches
    sink = open_sink(request.stdout_path)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=launch.cwd,
            env=full_env,
            start_new_session=True,
            preexec_fn=preexec,
            user=popen_user.uid if popen_user else None,
            group=popen_user.gid if popen_user else None,
            extra_groups=[] if popen_user else None,
            pass_fds=launch.pass_fds,
        )
    except BaseException as exc:
        if sink is not None:
            sink.close()
        if not isinstance(exc, OSError):
            raise
        # e.g. a list command whose program does not exist: report it like a shell would
        return ExecResult(127, "", str(exc), False, False, time.monotonic() - started)

    watch = Supervisor(proc, sink, launch.drain_s)
    reason: str | None = None
    try:
        reason = watch.run(request.timeout, request.inactivity_timeout, request.activity)
    finally:
        if reason is not None or proc.poll() is None:
            kill_tree(proc, exec_id, launch.kill_grace_s)
        watch.close()
        if sink is not None:
            sink.close()
    proc.wait()
    return ExecResult(
        exit_code=None if reason else proc.returncode,
        stdout_tail=watch.stdout.text(),
        stderr_tail=watch.stderr.text(),
        timed_out=reason == "timeout",
        inactive=reason == "inactive",
        duration_s=time.monotonic() - started,
    )


def _only_joins(launch: HostLaunch) -> bool:
    """The child would do nothing before exec but join its kill group (`ResourceLimits()` sets
    no limit: `rlimit_setter` plans nothing for it)."""
    no_limits = launch.limits is None or launch.limits == ResourceLimits()
    return launch.user is None and no_limits


def child_setup(launch: HostLaunch) -> Callable[[], None] | None:
    """What the forked child does before exec: its limits and, with a kill group, join it and
    only then become the agent (Popen switches users before it calls this, and an agent may
    not write the group's files)."""
    limits = rlimit_setter(launch.limits) if launch.limits else None
    procs, user = launch.cgroup_procs, launch.user
    if procs is None:
        return limits

    def setup() -> None:
        join_in_child(procs)
        if limits is not None:
            limits()
        if user is not None:
            os.setgroups([])
            os.setresgid(user.gid, user.gid, user.gid)
            os.setresuid(user.uid, user.uid, user.uid)

    return setup


def kill_tagged(
    runtime_id: str, deadline_s: float = 10.0, uids: Collection[int] | None = None
) -> list[int]:
    """SIGKILL every process tagged with `runtime_id` until none is left; return pids that would
    not die. `uids`: the users its processes can run as (`tagged_processes`), when known.

    Processes are frozen with SIGSTOP before the kill so that a forking process cannot
    outrun the scan; children forked meanwhile inherit the tag and show up on the rescan.
    """
    end = time.monotonic() + deadline_s
    frozen: dict[int, psutil.Process] = {}
    while time.monotonic() < end:
        found = {p.pid: p for p in tagged_processes(RUNTIME_TAG, runtime_id, uids)}
        new = {pid: p for pid, p in found.items() if pid not in frozen}
        if not new:
            if not frozen:
                return []
            signal_all(frozen.values(), signal.SIGKILL)
            alive = wait_gone(frozen.values(), end - time.monotonic())
            frozen = {p.pid: p for p in alive}
            continue
        signal_all(new.values(), signal.SIGSTOP)
        frozen.update(new)
    return sorted(frozen)


def tagged_pids(runtime_id: str, uids: Collection[int] | None = None) -> list[int]:
    """Pids of the live processes tagged with `runtime_id` (among those of `uids`, if given)."""
    return sorted(p.pid for p in tagged_processes(RUNTIME_TAG, runtime_id, uids))


def raise_on_survivors(runtime_id: str, survivors: list[int]) -> None:
    if survivors:
        raise RuntimeError(f"runtime {runtime_id}: processes survived SIGKILL: {survivors}")
