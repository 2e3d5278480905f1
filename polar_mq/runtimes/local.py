"""The `local` runtime: a workspace directory plus tagged process sessions on this node.

Nothing lives in memory: the sandbox is `root/<runtime_id>/` and its processes are found by the
environment variable `POLAR_MQ_RUNTIME_ID=<id>` that every one of them inherits. That is what lets
the prepare, run-agent and evaluate stages (different worker processes) share a runtime, and what
lets `stop()` from any process kill daemons that left their session with setsid.

The tag cannot survive a process that deliberately re-executes itself with a scrubbed environment;
catching that needs kernel help (cgroups or namespaces), which the `bwrap`/`docker` runtimes bring.

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
from polar_mq.runtimes import private_view
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

    def reset(self) -> None:
        survivors = kill_tagged(self.runtime_id, uids=self._owners())
        self.space.recreate_dirs()
        raise_on_survivors(self.runtime_id, survivors)

    def stop(self) -> None:
        agent = self.agent
        survivors = kill_tagged(self.runtime_id, uids=self._owners())
        if not survivors:
            self.space.release_agent(agent)
        self.space.remove_quietly()
        raise_on_survivors(self.runtime_id, survivors)
        self.space.check_removed()

    def alive_processes(self) -> list[int]:
        return tagged_pids(self.runtime_id, self._owners())

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
        with private_view.status_channel() as status:
            argv = view.argv(request.argv, status.fd, agent, launch.cwd)
            launch = replace(launch, user=None, pass_fds=(status.fd,))
            result = run_on_host(argv, request, launch)
            failure = status.failure()
        if failure is not None:  # the platform's failure: never scored as the agent's exit
            where = f"runtime {self.runtime_id}"
            raise RuntimeError(f"{where}: cannot start the command in its private view: {failure}")
        return result
