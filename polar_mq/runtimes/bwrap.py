"""The `bwrap` runtime: every command runs in a fresh bubblewrap sandbox over the runtime's files.

What a command sees: the host's system directories read-only (`/usr`, `/etc`, the Python that
runs the worker and the polar_mq package, so the reference agent works), its own workspace, home
and tmp directories writable at the same paths as on the host (so `workdir`, task-file paths and
`POLAR_WORKDIR` mean the same inside and out), a private `/tmp`, `/proc` and `/dev`, and private
pid, ipc and uts namespaces. Nothing else of the host is visible: not the other runtimes under the
same root, not the worker's home or the repository. All capabilities are dropped, also when the
worker runs as root. Network: `host` shares the node's network namespace (the proxy on 127.0.0.1 is
reachable) and `none` gives the command an empty one (loopback only, nothing outside).

Lifetime: each exec is one pid namespace whose init is bwrap's own. When the command exits, or
when that init is killed, the kernel kills every process left in the namespace, daemons included;
so unlike `local`, background processes end with the command that started them. Re-attach works
as for `local` (this class reuses it): both bwrap processes of an exec carry the runtime's tag in
their environment, and bwrap itself cannot scrub it, so `stop()` from any process finds and kills
them, and with them everything in the sandbox. With `pids_limit`, execs also run in a pids cgroup
(`cgroups.py`), which caps the process count and lists every member for the kill.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import psutil

import polar_mq
from polar_mq.runtimes import cgroups
from polar_mq.runtimes.base import ExecResult, ResourceLimits
from polar_mq.runtimes.local import LocalRuntime, _atomic_write, _signal_all, _wait_gone

Network = Literal["host", "none"]
NETWORKS: tuple[Network, ...] = ("host", "none")
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


class BwrapRuntime(LocalRuntime):
    """A local runtime whose commands run inside bubblewrap namespaces.

    `network`, `pids_limit` and `ro_binds` take effect at `start()` and are recorded next to the
    sandbox, so handles built later (in other stages) run commands the same way.
    """

    kind = "bwrap"

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
    ) -> None:
        # absolute: the directories are bound at the same paths inside the sandbox
        root = Path(root).resolve()
        super().__init__(runtime_id, root, limits, kill_grace_s=kill_grace_s, drain_s=drain_s)
        if network not in NETWORKS:
            raise ValueError(f"bwrap network must be one of {', '.join(NETWORKS)}, not {network!r}")
        if pids_limit is not None and (not isinstance(pids_limit, int) or pids_limit < 1):
            raise ValueError("pids_limit must be a positive int or None")
        self.network: Network = network
        self.pids_limit = pids_limit
        self.ro_binds = [str(Path(p)) for p in ro_binds]
        self.cgroup = cgroups.group_path(cgroups.group_name(self.runtime_id, self.root))

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if shutil.which("bwrap") is None:
            raise RuntimeError("bwrap runtime: bubblewrap is not installed on this node")
        super().start()
        if self.pids_limit is not None:
            cgroups.create(self.cgroup.name, self.pids_limit)
        settings = {"network": self.network, "pids_limit": self.pids_limit, "ro": self.ro_binds}
        _atomic_write(self.path / _SETTINGS_FILE, json.dumps(settings).encode())

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            cgroups.remove(self.cgroup)

    def alive_processes(self) -> list[int]:
        return sorted(set(super().alive_processes()) | set(cgroups.members(self.cgroup)))

    def _kill_all(self, deadline_s: float = 10.0) -> list[int]:
        """The tag scan of `local`, then whatever the cgroup still lists (scrubbed processes)."""
        survivors = super()._kill_all(deadline_s)
        members = []
        for pid in cgroups.members(self.cgroup):
            try:
                members.append(psutil.Process(pid))
            except psutil.Error:
                continue
        _signal_all(members, signal.SIGKILL)
        left = _wait_gone(members, 5.0)
        return sorted(set(survivors) | {p.pid for p in left})

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
        inner = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        inner_cwd = self._resolve(cwd) if cwd else self.workdir
        argv = self._sandbox_argv(inner, inner_cwd)
        return super().exec(
            argv,
            env=env,
            cwd=cwd,
            timeout=timeout,
            inactivity_timeout=inactivity_timeout,
            activity=activity,
            stdout_path=stdout_path,
        )

    def _recorded(self) -> dict[str, object]:
        try:
            recorded = json.loads((self.path / _SETTINGS_FILE).read_text())
        except (OSError, ValueError):
            return {"network": self.network, "pids_limit": self.pids_limit, "ro": self.ro_binds}
        return recorded if isinstance(recorded, dict) else {}

    def _sandbox_argv(self, inner: list[str], cwd: Path) -> list[str]:
        settings = self._recorded()
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
        if settings.get("network") == "none":
            argv.append("--unshare-net")
        # /tmp first: a bind below it (a checkout or venv under /tmp) is mounted onto the tmpfs
        # instead of being hidden by it
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        ro = [*_SYSTEM_DIRS, *_python_dirs(), *_as_strs(settings.get("ro"))]
        for path in dict.fromkeys(ro):  # ordered, no duplicates
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            else:
                argv += ["--ro-bind-try", path, path]
        for directory in (self.workdir, self.path / "home", self.path / "tmp"):
            argv += ["--bind", str(directory), str(directory)]
        argv += ["--chdir", str(cwd), "--", *inner]
        if settings.get("pids_limit") is not None:
            procs = self.cgroup / "cgroup.procs"
            if not procs.exists():
                raise RuntimeError(f"runtime {self.runtime_id}: its pids cgroup is gone ({procs})")
            argv = ["/bin/sh", "-c", _CGROUP_TRAMPOLINE, str(procs), *argv]
        return argv


def _python_dirs() -> list[str]:
    """What the reference agent needs: this interpreter's prefixes and the polar_mq package."""
    package = Path(polar_mq.__file__).resolve().parent
    return [sys.base_prefix, sys.prefix, str(package)]


def _as_strs(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []
