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
is owner-only). What `local` does not give: a private `/proc` (agents of one node share one
user, so they can see each other) and a network policy; `bwrap` and `docker` have both. A
workspace the agent user cannot reach (below a 0700 directory) is refused in production at
`start()`; in development the runtime then keeps the worker's identity and says so once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from polar_mq.runtimes import identity, safe_files
from polar_mq.runtimes.agent_pool import POOL_PREFIX, AgentPool
from polar_mq.runtimes.base import ExecResult, ResourceLimits, Runtime, check_exec_timeouts
from polar_mq.runtimes.identity import AgentIdentity
from polar_mq.runtimes.process_kit import (
    EXEC_TAG,
    RUNTIME_TAG,
    Supervisor,
    atomic_write,
    kill_tree,
    open_sink,
    rlimit_setter,
    signal_all,
    tagged_processes,
    wait_gone,
)

if TYPE_CHECKING:
    from polar_mq.config import Settings

__all__ = ["EXEC_TAG", "RUNTIME_TAG", "LocalRuntime"]

_META_FILE = "runtime.json"
# Worker variables an ordinary program needs; everything else (database URLs, secrets) stays out.
_PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "SSL_CERT_FILE")


class LocalRuntime(Runtime):
    """A runtime made of a directory and the processes tagged with its id.

    `kill_grace_s` is how long an expired command gets between SIGTERM and SIGKILL; `drain_s` is
    how long output is still collected after the command exited while a background child keeps
    its pipes open.
    """

    kind = "local"
    owner_only_dirs = True
    """Agent directories 0700: under `local` only the uid separates rollouts. (`bwrap` builds its
    sandbox as a capability-less root that must still enter them; its mounts separate rollouts.)"""

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
        self.root = Path(root)
        self.path = self.root / self.runtime_id
        self._limits = limits
        self._agent = agent
        self.kill_grace_s = kill_grace_s
        self.drain_s = drain_s

    @property
    def workdir(self) -> Path:
        return self.path / "workspace"

    @property
    def limits(self) -> ResourceLimits | None:
        """Limits given to this handle, else those recorded by whoever started the runtime."""
        if self._limits is not None:
            return self._limits
        recorded = self._meta().get("limits")
        return ResourceLimits(**recorded) if recorded else None

    @property
    def agent(self) -> AgentIdentity:
        """Who commands run as: recorded at `start()`, so every later handle agrees with it."""
        recorded = self._meta().get("agent")
        if isinstance(recorded, dict):
            return AgentIdentity(int(recorded["uid"]), int(recorded["gid"]), str(recorded["name"]))
        return self._agent or identity.node_identity()

    def _meta(self) -> dict[str, Any]:
        try:
            meta = json.loads((self.path / _META_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return meta if isinstance(meta, dict) else {}

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        for directory in self._agent_dirs():
            directory.mkdir(parents=True, exist_ok=True)
        meta_path = self.path / _META_FILE
        if self._limits is not None or not meta_path.exists():
            limits = self._limits
            meta = {
                "kind": self.kind,
                "runtime_id": self.runtime_id,
                "limits": None if limits is None else _limits_dict(limits),
                "agent": self._choose_agent().as_dict(),
            }
            atomic_write(meta_path, json.dumps(meta).encode())
        self._give_dirs()

    def _agent_dirs(self) -> tuple[Path, ...]:
        return (self.workdir, self.path / "home", self.path / "tmp")

    def _choose_agent(self) -> AgentIdentity:
        """The identity this runtime will run commands as (see the module docstring)."""
        agent = self._agent or self._pool_agent() or identity.node_identity()
        if not agent.switch or identity.can_reach(self.workdir, agent):
            return agent
        self._release_agent(agent)
        message = (
            f"runtime root {self.root} is not reachable by the agent user {agent.name} (uid "
            f"{agent.uid}): a parent directory is private; put POLAR_MQ_RUNTIME_ROOT below "
            "directories every user may enter (e.g. /tmp/polar_mq/runtimes)"
        )
        settings = _settings()
        if settings.is_production or not settings.unsafe_root_agents:
            raise RuntimeError(message)
        identity.say_once(f"{message}; POLAR_MQ_UNSAFE_ROOT_AGENTS: agents there run as the worker")
        return identity.worker_identity()

    def _pool_agent(self) -> AgentIdentity | None:
        """A user of its own from the node's pool (`agent_pool`), when the node uses the default
        agent user and the worker can switch users; None otherwise or when the pool is busy."""
        settings = _settings()
        if settings.agent_user or not identity.node_identity().switch:
            return None
        return AgentPool(settings.agent_claims_dir).claim(self.path)

    def _release_agent(self, agent: AgentIdentity) -> None:
        if agent.name.startswith(POOL_PREFIX):
            AgentPool(_settings().agent_claims_dir).release(self.path, agent.uid)

    def _give_dirs(self) -> None:
        """The agent owns its directories; the runtime directory stays the worker's, unlisted."""
        agent = self.agent
        if not agent.switch:
            return
        self.path.chmod(0o711)
        info = self.root.stat()
        if info.st_uid == os.geteuid() and not info.st_mode & stat.S_ISVTX:
            # enterable, not listable: an agent cannot read the other runtimes' ids (a shared
            # sticky directory such as /tmp itself is left alone)
            self.root.chmod(stat.S_IMODE(info.st_mode) & ~0o044)
        for directory in self._agent_dirs():
            os.lchown(directory, agent.uid, agent.gid)
            if self.owner_only_dirs:
                # agents of other runtimes (other pool users) cannot look in
                directory.chmod(0o700)

    def hand_over(self) -> None:
        identity.chown_tree(self.workdir, self.agent)

    def reset(self) -> None:
        survivors = self._kill_all()
        for directory in self._agent_dirs():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True, exist_ok=True)
        self._give_dirs()
        _raise_on_survivors(self.runtime_id, survivors)

    def stop(self) -> None:
        agent = self.agent
        survivors = self._kill_all()
        if not survivors:
            self._release_agent(agent)
        shutil.rmtree(self.path, ignore_errors=True)
        _raise_on_survivors(self.runtime_id, survivors)
        if self.path.exists():
            raise RuntimeError(f"runtime {self.runtime_id}: could not remove {self.path}")

    def alive_processes(self) -> list[int]:
        return sorted(p.pid for p in tagged_processes(RUNTIME_TAG, self.runtime_id))

    # -- files ---------------------------------------------------------------------------------

    def upload(self, data: bytes, dest: str) -> None:
        """Write a file the agent owns (and the directories made for it), so it can use it; never
        through a link the agent left (see `safe_files`: UnsafePath otherwise)."""
        candidate = Path(dest)
        # lexically (links are refused by `safe_files` below, not followed here)
        target = Path(
            os.path.normpath(candidate if candidate.is_absolute() else self.workdir / dest)
        )
        # only into the agent's own directories: a link the agent planted must not make the
        # worker overwrite the runtime's records (runtime.json names the user commands run as)
        mine = [*self._agent_dirs(), *(d.resolve() for d in self._agent_dirs())]
        if not any(target.is_relative_to(d) and target != d for d in mine):
            where = "runtime" if not target.is_relative_to(self.path) else "workspace, home and tmp"
            raise safe_files.UnsafePath(f"path {dest!r} is outside {where} {self.runtime_id}")
        made = [p for p in target.parents if p.is_relative_to(self.path) and not p.exists()]
        safe_files.write_file(self.path, dest, self.workdir, data)
        agent = self.agent
        if agent.switch:
            for path in [target, *made]:
                os.lchown(path, agent.uid, agent.gid)

    def download(self, path: str) -> bytes:
        """Never through a link the agent left: see `safe_files` (UnsafePath otherwise)."""
        return safe_files.read_file(self.path, path, self.workdir)

    def refuse_links(self, path: str) -> None:
        safe_files.refuse_links(self.path, path, self.workdir)

    def _resolve(self, path: str) -> Path:
        """Map a sandbox path to the host, refusing anything outside the runtime directory."""
        candidate = Path(path)
        full = (candidate if candidate.is_absolute() else self.workdir / candidate).resolve()
        if not full.is_relative_to(self.path.resolve()):
            raise ValueError(f"path {path!r} is outside runtime {self.runtime_id}")
        return full

    # -- processes -----------------------------------------------------------------------------

    def exec(
        self,
        command: str | list[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        inactivity_timeout: float | None = None,
        activity: Callable[[], float] | None = None,
        stdout_path: Path | None = None,
    ) -> ExecResult:
        if not self.workdir.is_dir():
            raise RuntimeError(f"runtime {self.runtime_id} is not started (no {self.workdir})")
        check_exec_timeouts(timeout, inactivity_timeout)
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        exec_id = uuid.uuid4().hex
        full_env = {**self._base_env(), **(env or {}), RUNTIME_TAG: self.runtime_id}
        full_env[EXEC_TAG] = exec_id
        limits = self.limits
        user = self._launch_as()
        sink = open_sink(stdout_path)
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self._resolve(cwd) if cwd else self.workdir,
                env=full_env,
                start_new_session=True,
                preexec_fn=rlimit_setter(limits) if limits else None,
                user=user.uid if user else None,
                group=user.gid if user else None,
                extra_groups=[] if user else None,
            )
        except BaseException as exc:
            if sink is not None:
                sink.close()
            if not isinstance(exc, OSError):
                raise
            # e.g. a list command whose program does not exist: report it like a shell would
            return ExecResult(127, "", str(exc), False, False, time.monotonic() - started)

        watch = Supervisor(proc, sink, self.drain_s)
        reason: str | None = None
        try:
            reason = watch.run(timeout, inactivity_timeout, activity)
        finally:
            if reason is not None or proc.poll() is None:
                kill_tree(proc, exec_id, self.kill_grace_s)
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

    def _launch_as(self) -> AgentIdentity | None:
        """The identity the command's process is started as (None: the worker's own).

        `local` switches in the child before exec; `bwrap` overrides this: it needs the worker's
        privileges to build the sandbox and switches inside it."""
        agent = self.agent
        return agent if agent.switch else None

    def _base_env(self) -> dict[str, str]:
        env = {key: os.environ[key] for key in _PASSTHROUGH_ENV if key in os.environ}
        env.setdefault("PATH", os.defpath)
        env["HOME"] = str(self.path / "home")
        env["TMPDIR"] = str(self.path / "tmp")
        return env

    def _kill_all(self, deadline_s: float = 10.0) -> list[int]:
        """SIGKILL every tagged process until none is left; return pids that would not die.

        Processes are frozen with SIGSTOP before the kill so that a forking process cannot
        outrun the scan; children forked meanwhile inherit the tag and show up on the rescan.
        """
        end = time.monotonic() + deadline_s
        frozen: dict[int, psutil.Process] = {}
        while time.monotonic() < end:
            found = {p.pid: p for p in tagged_processes(RUNTIME_TAG, self.runtime_id)}
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


def _limits_dict(limits: ResourceLimits) -> dict[str, Any]:
    return {
        "memory_mb": limits.memory_mb,
        "cpu_seconds": limits.cpu_seconds,
        "max_open_files": limits.max_open_files,
    }


def _settings() -> Settings:
    from polar_mq.config import get_settings  # config imports nothing of the runtimes

    return get_settings()


def _raise_on_survivors(runtime_id: str, survivors: list[int]) -> None:
    if survivors:
        raise RuntimeError(f"runtime {runtime_id}: processes survived SIGKILL: {survivors}")
