"""The `local` runtime: a workspace directory plus tagged process sessions on this node.

Nothing lives in memory: the sandbox is `root/<runtime_id>/` and its processes are found by the
environment variable `POLAR_MQ_RUNTIME_ID=<id>` that every one of them inherits. That is what lets
the prepare, run-agent and evaluate stages (different worker processes) share a runtime, and what
lets `stop()` from any process kill daemons that left their session with setsid.

The tag cannot survive a process that deliberately re-executes itself with a scrubbed environment
(`env -i`). So a runtime on a pool uid of its own has `stop()`/`reset()` kill every process of
that uid until none is left (`uid_sweep.py`): no process outlives its rollout and none waits
under the uid for its next holder (the pool checks again before it hands the uid out, and
quarantines it if one survives); the files the uid left in the node's `/tmp`, `/dev/shm` and
`/var/tmp` are removed too (with the private view the agent has its own instead). A runtime whose
uid is shared (the node's agent user when the pool is busy or `agent_user` is set, the worker's
own) cannot be swept by uid: where the node has a writable cgroup v2 hierarchy its commands join
the runtime's kill group (`kill_group.py`) before they become the agent, and the stop writes
`cgroup.kill` instead of scanning tags.

Never root: commands run as the node's agent identity (`identity.py`), which owns the workspace,
home and tmp directories; the runtime directory itself stays the worker's (mode 0711, so an agent
cannot list it). That identity cannot read the processes of a root worker (`/proc/<pid>/environ`
is owner-only). Where the node allows it, each command also starts in a private mount view
(`private_view.py`) that hides the checkout, the logs and the other runtimes. What `local` does
not give: a private `/proc` (agents of one node share one
user, so they can see each other) and a network policy; `bwrap` and `docker` have both. A
workspace the agent user cannot reach (below a 0700 directory) is refused in production at
`start()`; in development the runtime then keeps the worker's identity and says so once.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from polar_mq.config import get_settings
from polar_mq.runtimes import kill_group, private_view, status_pipe, uid_sweep
from polar_mq.runtimes.agent_pool import POOL_PREFIX, AgentPool
from polar_mq.runtimes.base import ExecRequest, ExecResult, ResourceLimits, Runtime
from polar_mq.runtimes.host_exec import (
    HostLaunch,
    kill_tagged,
    raise_on_survivors,
    run_on_host,
    tagged_pids,
)
from polar_mq.runtimes.identity import AgentIdentity, node_identity, say_once
from polar_mq.runtimes.process_kit import EXEC_TAG, RUNTIME_TAG
from polar_mq.runtimes.workspace_dir import DirBacked

__all__ = ["EXEC_TAG", "RUNTIME_TAG", "LocalRuntime"]


class LocalRuntime(DirBacked, Runtime):
    """A runtime made of a directory (`RuntimeDir`) and the processes tagged with its id.

    `kill_grace_s` is how long an expired command gets between SIGTERM and SIGKILL; `drain_s` is
    how long output is still collected after the command exited while a background child keeps
    its pipes open.
    """

    kind = "local"
    owner_only_dirs = True
    """Agent directories 0700: under `local` only the uid separates rollouts."""

    def __init__(
        self,
        runtime_id: str,
        root: Path,
        limits: ResourceLimits | None = None,
        *,
        kill_grace_s: float = 2.0,
        drain_s: float = 0.5,
        agent: AgentIdentity | None = None,
    ) -> None:
        super().__init__(runtime_id)
        self._attach_dir(
            root,
            self.kind,
            limits,
            agent,
            owner_only_dirs=self.owner_only_dirs,
            pooled=True,
            kill_grace_s=kill_grace_s,
            drain_s=drain_s,
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if (self.space.given_agent or node_identity()).switch:
            private_view.require_view(get_settings())
        self.space.create()
        group = self._group()
        if group is not None:
            kill_group.create(group)

    def reset(self) -> None:
        survivors = self._kill_all()
        self.space.recreate_dirs()
        self._remove_shared_tmp(survivors)
        raise_on_survivors(self.runtime_id, survivors)

    def stop(self) -> None:
        agent = self.agent
        survivors = self._kill_all()
        self._remove_shared_tmp(survivors)
        if not survivors:
            self.space.release_agent(agent)
            kill_group.remove(self._group())
        self.space.remove_quietly()
        raise_on_survivors(self.runtime_id, survivors)
        self.space.check_removed()

    def alive_processes(self) -> list[int]:
        uid = self._pool_uid()
        if uid is not None:
            return sorted(uid_sweep.pids_of(uid))
        group = self._group()
        if group is not None and group.is_dir():
            return sorted(kill_group.members(group))
        return tagged_pids(self.runtime_id, self._owners())

    def _kill_all(self) -> list[int]:
        """Every process of its pool uid (which the environment tag would miss), else of its kill
        group, else its tagged ones; return the pids still alive after SIGKILL.

        The pool uid sweep replaces the tag scan: both read a file per process of the node that
        root owns, and every process of the rollout runs as the uid (a setuid-root program it
        ran still has it as real uid) but the view helper's instant before it becomes the agent,
        which an exec starting during the stop could be in; the pool's check at the next claim
        kills it then."""
        uid = self._pool_uid()
        group = self._group()
        survivors: set[int] = set()
        if group is not None and group.is_dir():
            survivors |= set(kill_group.kill(group))
        if uid is not None:
            survivors |= set(uid_sweep.kill_uid(uid))
        elif group is None or not group.is_dir():
            survivors |= set(kill_tagged(self.runtime_id, uids=self._owners()))
        return sorted(survivors)

    def _remove_shared_tmp(self, survivors: list[int]) -> None:
        """What the pool uid left in the node's /tmp, /dev/shm, /var/tmp (nothing is left there
        once its processes are dead: a survivor could write again, and the uid is not reused)."""
        uid = self._pool_uid()
        if uid is not None and not survivors:
            uid_sweep.remove_files_of(uid)

    def _group(self) -> Path | None:
        """The runtime's kill group; None for a runtime on a pool uid of its own, whose uid
        sweep already finds every process: joining a cgroup costs each command milliseconds (the
        kernel's cgroup migration waits for an RCU grace period, longer on a busy node;
        docs/benchmarks.md), the sweep a /proc scan per stop (docs/runtimes.md)."""
        recorded = self.space.meta().get("agent")
        if isinstance(recorded, dict) and str(recorded.get("name")).startswith(POOL_PREFIX):
            return None
        return kill_group.group_for(self.runtime_id, self.root)

    def _pool_uid(self) -> int | None:
        """The pool uid this runtime holds (or last held, if no other runtime holds it since):
        every process and shared temporary file of it is this runtime's. None for any other
        identity, e.g. the node's shared agent user, whose processes are other runtimes' too."""
        recorded = self.space.meta().get("agent")
        if not isinstance(recorded, dict) or not str(recorded.get("name")).startswith(POOL_PREFIX):
            return None
        uid = int(recorded["uid"])
        if uid in (0, os.geteuid()):
            return None
        holder = AgentPool(get_settings().agent_claims_dir, members=[]).holder(uid)
        return uid if holder in (None, str(self.path)) else None

    def _owners(self) -> frozenset[int] | None:
        """The users this runtime's processes can run as: its recorded agent, the worker (what
        it starts itself, e.g. the private view's setup), root (a program the agent ran setuid
        shows as root); None, every process, when its record is gone. The scan for its tagged
        processes then reads the environments of these only, not of every other rollout's
        agents (an environment read per process of the node, per runtime stopped)."""
        recorded = self.space.meta().get("agent")
        if not isinstance(recorded, dict):
            return None
        return frozenset({0, os.geteuid(), int(recorded["uid"])})

    # -- processes -----------------------------------------------------------------------------

    def _run(self, request: ExecRequest) -> ExecResult:
        """The request's argv as the agent user: in its private view where the node can build
        one (`private_view`), else switched in the child before exec."""
        self.space.require_started()
        agent = self.agent
        launch = HostLaunch(
            runtime_id=self.runtime_id,
            base_env=self.space.host_env(),
            cwd=self.space.resolve(request.cwd),
            limits=self.limits,
            user=agent if agent.switch else None,
            kill_grace_s=self.kill_grace_s,
            drain_s=self.drain_s,
            cgroup_procs=kill_group.procs_file(self._group()),
        )
        if not agent.switch:
            return run_on_host(request.argv, request, launch)
        reason = private_view.unavailable_reason()
        if reason is not None:
            say_once(private_view.shared_view_message(reason))
            return run_on_host(request.argv, request, launch)
        return self._run_in_view(request, launch, agent)

    def _run_in_view(
        self, request: ExecRequest, launch: HostLaunch, agent: AgentIdentity
    ) -> ExecResult:
        """Through `mount_view`, which builds the view as root, then becomes the agent."""
        view = private_view.plan_view(get_settings(), self.root, self.path, agent)
        with status_pipe.status_channel() as status:
            argv = view.argv(request.argv, status.fd, agent, launch.cwd)
            launch = replace(launch, user=None, pass_fds=(status.fd,))
            result = run_on_host(argv, request, launch)
            failure = status.failure()
        if failure is not None:  # the platform's failure: never scored as the agent's exit
            where = f"runtime {self.runtime_id}"
            raise RuntimeError(f"{where}: cannot start the command in its private view: {failure}")
        return result
