"""The `bwrap` runtime: every command runs in a fresh bubblewrap sandbox over the runtime's files.

What a command sees: the host's system directories read-only (`/usr`, `/etc`, the Python that
runs the worker and the polar_mq package, so the reference agent works), its own workspace, home
and tmp directories writable at the same paths as on the host (so `workdir`, task-file paths and
`POLAR_WORKDIR` mean the same inside and out), a private `/tmp`, `/proc` and `/dev`, and private
pid, ipc and uts namespaces. Nothing else of the host is visible: not the other runtimes under the
same root, not the worker's home or the repository. All capabilities are dropped, also when the
worker runs as root. Network: `host` shares the node's network namespace (the proxy on 127.0.0.1 is
reachable), `none` gives the command an empty one (loopback only, nothing outside), and
`proxy_only` an empty one plus the proxy: `agent_proxy_url` records the proxy's address and
returns `http://127.0.0.1:8010/...`, where `forwarder.py` listens inside the sandbox and relays to
a Unix socket that the worker serves for the duration of the command (`proxy_relay.py`).

Never root: when the worker is root, bwrap starts as root (it needs to build the namespaces) with
every capability dropped but CAP_SETUID/CAP_SETGID, and the command is started through `setpriv`
as the node's agent identity (`identity.py`), which clears those two as well. The private `/proc`
then shows the sandbox's own processes only, and the agent owns nothing but its directories.

Lifetime: each exec is one pid namespace whose init is bwrap's own. When the command exits, or
when that init is killed, the kernel kills every process left in the namespace, daemons included;
so unlike `local`, background processes end with the command that started them. Re-attach works
as for `local` (the same `RuntimeDir` and tag scan, composed, not inherited): both bwrap
processes of an exec carry the runtime's tag in their environment, and bwrap itself cannot scrub
it, so `stop()` from any process finds and kills them, and with them everything in the sandbox.
With `pids_limit`, execs also run in a pids cgroup (`cgroups.py`), which caps the process count
and lists every member for the kill.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import psutil

import polar_mq
from polar_mq.runtimes import cgroups, forwarder
from polar_mq.runtimes.base import ExecRequest, ExecResult, ResourceLimits, Runtime
from polar_mq.runtimes.host_exec import (
    HostLaunch,
    kill_tagged,
    raise_on_survivors,
    run_on_host,
    tagged_pids,
)
from polar_mq.runtimes.identity import AgentIdentity
from polar_mq.runtimes.process_kit import atomic_write, signal_all, wait_gone
from polar_mq.runtimes.proxy_relay import (
    PROXY_PORT_INSIDE,
    ProxyRelay,
    record_route,
    recorded_route,
)
from polar_mq.runtimes.sandboxed import (
    NETWORKS,
    Network,
    Sandboxed,
)

PROXY_SOCKET_INSIDE = "/run/polar-mq/proxy.sock"
_SETTINGS_FILE = "bwrap.json"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
# Enter the sandbox's cgroup, then become bwrap: the shell's pid is the future bwrap's pid, so
# nothing forks outside the group. $0 is the group's cgroup.procs file.
_CGROUP_TRAMPOLINE = 'echo $$ > "$0" && exec "$@"'


def bwrap_available() -> str | None:
    """None when bubblewrap can create a sandbox here, else the reason it cannot."""
    program = shutil.which("bwrap")
    if program is None:
        return "bubblewrap is not installed (apt-get install -y bubblewrap)"
    probe = [program, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap does not run: {exc}"
    if done.returncode != 0:
        return f"bwrap cannot create namespaces here: {done.stderr.decode(errors='replace')}"
    return None


@dataclass(frozen=True, slots=True)
class StartedWith:
    """The options a sandbox was started with, recorded next to it (`bwrap.json`) so handles
    built later, in other stages and processes, run commands the same way."""

    network: Network = "host"
    pids_limit: int | None = None
    ro: tuple[str, ...] = ()
    """Extra read-only binds (a preset's install)."""

    def to_json(self) -> bytes:
        return json.dumps(
            {"network": self.network, "pids_limit": self.pids_limit, "ro": list(self.ro)}
        ).encode()

    @classmethod
    def parse(cls, raw: bytes) -> StartedWith | None:
        """The record as written by `to_json`, or None when it is not one."""
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("network") not in NETWORKS:
            return None
        pids, ro = data.get("pids_limit"), data.get("ro")
        if not (pids is None or (isinstance(pids, int) and not isinstance(pids, bool))):
            return None
        if not isinstance(ro, list):
            return None
        return cls(data["network"], pids, tuple(str(path) for path in ro))


class BwrapRuntime(Sandboxed, Runtime):
    """A runtime whose commands run inside bubblewrap namespaces over its `RuntimeDir`.

    `network`, `pids_limit` and `ro_binds` take effect at `start()` and are recorded next to the
    sandbox, so handles built later (in other stages) run commands the same way.
    """

    kind = "bwrap"
    owner_only_dirs = False
    """bwrap builds its sandbox as a capability-less root that must still enter the agent
    directories; its mounts, not the directory modes, separate rollouts."""

    def __init__(
        self,
        runtime_id: str,
        root: Path,
        limits: ResourceLimits | None = None,
        *,
        network: Network = "host",
        pids_limit: int | None = None,
        ro_binds: Sequence[str | Path] = (),
        kill_grace_s: float = 2.0,
        drain_s: float = 0.5,
        agent: AgentIdentity | None = None,
    ) -> None:
        super().__init__(runtime_id)
        self._set_up_sandbox(
            root, limits, agent, network=network, pids_limit=pids_limit,
            kill_grace_s=kill_grace_s, drain_s=drain_s,
        )  # fmt: skip
        self.ro_binds = [str(Path(p)) for p in ro_binds]
        self.cgroup = cgroups.group_path(cgroups.group_name(self.runtime_id, self.root))

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if shutil.which("bwrap") is None:
            raise RuntimeError("bwrap runtime: bubblewrap is not installed on this node")
        self.space.create()
        if self.pids_limit is not None:
            cgroups.create(self.cgroup.name, self.pids_limit)
        atomic_write(self.path / _SETTINGS_FILE, self._configured().to_json())

    def reset(self) -> None:
        survivors = self._kill_all()
        self.space.recreate_dirs()
        raise_on_survivors(self.runtime_id, survivors)

    def stop(self) -> None:
        try:
            agent = self.agent
            survivors = self._kill_all()
            if not survivors:
                self.space.release_agent(agent)
            self.space.remove_quietly()
            raise_on_survivors(self.runtime_id, survivors)
            self.space.check_removed()
        finally:
            cgroups.remove(self.cgroup)

    def alive_processes(self) -> list[int]:
        return sorted(set(tagged_pids(self.runtime_id)) | set(cgroups.members(self.cgroup)))

    def _kill_all(self, deadline_s: float = 10.0) -> list[int]:
        """The tag scan of `local`, then whatever the cgroup still lists (scrubbed processes)."""
        survivors = kill_tagged(self.runtime_id, deadline_s)
        members = []
        for pid in cgroups.members(self.cgroup):
            try:
                members.append(psutil.Process(pid))
            except psutil.Error:
                continue
        signal_all(members, signal.SIGKILL)
        left = wait_gone(members, 5.0)
        return sorted(set(survivors) | {p.pid for p in left})

    # -- proxy route (network: proxy_only) ------------------------------------------------------

    def agent_proxy_url(self, url: str) -> str:
        if self._recorded().network != "proxy_only":
            return url
        return record_route(self.path, url)

    # -- processes -----------------------------------------------------------------------------

    def _run(self, request: ExecRequest) -> ExecResult:
        """bwrap starts with the worker's privileges (it builds the namespaces); the command
        switches to the agent user inside (`setpriv`)."""
        self.space.require_started()
        inner_cwd = self.space.resolve(request.cwd)
        route = recorded_route(self.path) if self._recorded().network == "proxy_only" else None
        launch = HostLaunch(
            runtime_id=self.runtime_id,
            base_env=self.space.host_env(),
            cwd=inner_cwd,
            limits=self.limits,
            user=None,
            kill_grace_s=self.kill_grace_s,
            drain_s=self.drain_s,
        )
        with ProxyRelay(route, self.agent) if route else nullcontext() as relay:
            socket_path = relay.socket_path if relay is not None else None
            argv = self._sandbox_argv(request.argv, inner_cwd, socket_path)
            return run_on_host(argv, request, launch)

    def _configured(self) -> StartedWith:
        return StartedWith(self.network, self.pids_limit, tuple(self.ro_binds))

    def _recorded(self) -> StartedWith:
        """What the sandbox was started with; this handle's own options (the job's, which
        started it) before `start()` or when the record cannot be read."""
        try:
            recorded = StartedWith.parse((self.path / _SETTINGS_FILE).read_bytes())
        except OSError:
            recorded = None
        return recorded if recorded is not None else self._configured()

    def _sandbox_argv(
        self, inner: list[str], cwd: Path, proxy_socket: Path | None = None
    ) -> list[str]:
        settings = self._recorded()
        agent = self.agent
        if proxy_socket is not None:
            relay = [sys.executable, "-I", "-S", forwarder.__file__, str(PROXY_PORT_INSIDE)]
            inner = [*relay, PROXY_SOCKET_INSIDE, *inner]
        if agent.switch:
            ids = [f"--reuid={agent.uid}", f"--regid={agent.gid}", "--clear-groups"]
            inner = ["setpriv", *ids, "--", *inner]
        argv = [
            "bwrap",
            "--die-with-parent",  # the exec's caller is gone: nobody would read or reap it
            "--new-session",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--hostname",
            "sandbox",
            "--cap-drop",
            "ALL",
        ]
        if agent.switch:  # only for setpriv, which drops them with root
            argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        if settings.network in ("none", "proxy_only"):
            argv.append("--unshare-net")
        # /tmp first: a bind below it (a checkout or venv under /tmp) is mounted onto the tmpfs
        # instead of being hidden by it. Sticky and world-writable like the node's (bwrap makes
        # them 0755 root's): the agent's own temporary space, gone with the exec's namespace
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--perms", "1777", "--tmpfs", "/dev/shm", "--perms", "1777", "--tmpfs", "/tmp"]
        ro = [*_SYSTEM_DIRS, *_python_dirs(), *settings.ro]
        made: set[str] = {"/", "/tmp"}
        for path in dict.fromkeys(ro):  # ordered, no duplicates
            if os.path.islink(path):
                made.add(path)
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.exists(path):
                argv += [*_parent_dirs(path, made), "--ro-bind", path, path]
        for directory in (self.workdir, self.path / "home", self.path / "tmp"):
            argv += [*_parent_dirs(str(directory), made), "--bind", str(directory), str(directory)]
        if proxy_socket is not None:
            argv += [*_parent_dirs(PROXY_SOCKET_INSIDE, made)]
            argv += ["--bind", str(proxy_socket), PROXY_SOCKET_INSIDE]
        argv += ["--chdir", str(cwd), "--", *inner]
        if settings.pids_limit is not None:
            procs = self.cgroup / "cgroup.procs"
            if not procs.exists():
                raise RuntimeError(f"runtime {self.runtime_id}: its pids cgroup is gone ({procs})")
            argv = ["/bin/sh", "-c", _CGROUP_TRAMPOLINE, str(procs), *argv]
        return argv


def _python_dirs() -> list[str]:
    """What the reference agent needs: this interpreter's prefixes and the polar_mq package."""
    package = Path(polar_mq.__file__).resolve().parent
    return [sys.base_prefix, sys.prefix, str(package)]


def _parent_dirs(path: str, made: set[str]) -> list[str]:
    """Create a bind's missing parents as 0755 directories: bwrap makes them 0700 when it runs
    as root, which would lock the agent user out of everything bound below them."""
    args: list[str] = []
    for parent in reversed(Path(path).parents):
        name = str(parent)
        if name not in made:
            made.add(name)
            args += ["--perms", "0755", "--dir", name]
    return args
