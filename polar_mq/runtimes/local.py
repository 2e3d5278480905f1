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

import contextlib
import json
import os
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import psutil

from polar_mq.runtimes import identity, safe_files
from polar_mq.runtimes.base import ExecResult, ResourceLimits, Runtime, check_exec_timeouts
from polar_mq.runtimes.identity import AgentIdentity

RUNTIME_TAG = "POLAR_MQ_RUNTIME_ID"
EXEC_TAG = "POLAR_MQ_EXEC_ID"
TAIL_BYTES = 8192
_READ_CHUNK = 65536
_FINAL_READS = 16
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
            _atomic_write(meta_path, json.dumps(meta).encode())
        self._give_dirs()

    def _agent_dirs(self) -> tuple[Path, ...]:
        return (self.workdir, self.path / "home", self.path / "tmp")

    def _choose_agent(self) -> AgentIdentity:
        """The identity this runtime will run commands as (see the module docstring)."""
        agent = self._agent or identity.node_identity()
        if not agent.switch or identity.can_reach(self.workdir, agent):
            return agent
        message = (
            f"runtime root {self.root} is not reachable by the agent user {agent.name} (uid "
            f"{agent.uid}): a parent directory is private; put POLAR_MQ_RUNTIME_ROOT below "
            "directories every user may enter (e.g. /tmp/polar_mq/runtimes)"
        )
        if _strict():
            raise RuntimeError(message)
        identity.say_once(f"{message}; development: agents there run as the worker's user")
        return identity.worker_identity()

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
        survivors = self._kill_all()
        shutil.rmtree(self.path, ignore_errors=True)
        _raise_on_survivors(self.runtime_id, survivors)
        if self.path.exists():
            raise RuntimeError(f"runtime {self.runtime_id}: could not remove {self.path}")

    def alive_processes(self) -> list[int]:
        return sorted(p.pid for p in _tagged_processes(RUNTIME_TAG, self.runtime_id))

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
        sink = _open_sink(stdout_path)
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
                preexec_fn=_rlimit_setter(limits) if limits else None,
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

        watch = _Supervisor(proc, sink, self.drain_s)
        reason: str | None = None
        try:
            reason = watch.run(timeout, inactivity_timeout, activity)
        finally:
            if reason is not None or proc.poll() is None:
                _kill_tree(proc, exec_id, self.kill_grace_s)
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
            found = {p.pid: p for p in _tagged_processes(RUNTIME_TAG, self.runtime_id)}
            new = {pid: p for pid, p in found.items() if pid not in frozen}
            if not new:
                if not frozen:
                    return []
                _signal_all(frozen.values(), signal.SIGKILL)
                alive = _wait_gone(frozen.values(), end - time.monotonic())
                frozen = {p.pid: p for p in alive}
                continue
            _signal_all(new.values(), signal.SIGSTOP)
            frozen.update(new)
        return sorted(frozen)


class _Tail:
    """The last `limit` bytes of a stream, trimmed in amortised steps."""

    def __init__(self, limit: int = TAIL_BYTES) -> None:
        self.limit = limit
        self.buf = bytearray()

    def add(self, chunk: bytes) -> None:
        self.buf += chunk
        if len(self.buf) > 2 * self.limit:
            del self.buf[: -self.limit]

    def text(self) -> str:
        return bytes(self.buf[-self.limit :]).decode("utf-8", errors="replace")


class _Supervisor:
    """Pumps a process's pipes and decides when it has to die; never blocks on a full pipe.

    Event driven: it sleeps in select until output arrives, the process exits (a pidfd where the
    kernel has one, else a short poll) or a deadline passes.
    """

    def __init__(self, proc: subprocess.Popen[bytes], sink: IO[bytes] | None, drain_s: float):
        assert proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.sink = sink
        self.drain_s = drain_s
        self.stdout = _Tail()
        self.stderr = _Tail()
        self.selector = selectors.DefaultSelector()
        self.open_streams = 0
        for stream, tail in ((proc.stdout, self.stdout), (proc.stderr, self.stderr)):
            os.set_blocking(stream.fileno(), False)
            self.selector.register(stream.fileno(), selectors.EVENT_READ, tail)
            self.open_streams += 1
        self.pidfd: int | None = None
        try:
            self.pidfd = os.pidfd_open(proc.pid)
            self.selector.register(self.pidfd, selectors.EVENT_READ, None)
        except (AttributeError, OSError):
            self.pidfd = None

    def run(
        self,
        timeout: float | None,
        inactivity_timeout: float | None,
        activity: Callable[[], float] | None,
    ) -> str | None:
        """Return "timeout" or "inactive" when the process must be killed, None when it ended."""
        start = time.monotonic()
        deadline = start + timeout if timeout is not None else float("inf")
        last_seen = start
        exited_at: float | None = None
        while True:
            now = time.monotonic()
            if exited_at is None and self.proc.poll() is not None:
                exited_at = now
            if exited_at is not None:
                if self.open_streams == 0 or now >= exited_at + self.drain_s:
                    return None
                wake = exited_at + self.drain_s
            else:
                if now >= deadline:
                    return "timeout"
                wake = deadline
                if inactivity_timeout is not None:
                    if now >= last_seen + inactivity_timeout and activity is not None:
                        last_seen = max(last_seen, _safe_activity(activity))
                    if now >= last_seen + inactivity_timeout:
                        return "inactive"
                    wake = min(wake, last_seen + inactivity_timeout)
                if self.pidfd is None:
                    wake = min(wake, now + 0.1)
            if self._pump(max(0.0, wake - now)):
                last_seen = time.monotonic()

    def _pump(self, wait: float) -> bool:
        """Wait up to `wait` seconds for events; return True when output arrived."""
        got_output = False
        for key, _ in self.selector.select(wait if wait != float("inf") else None):
            if key.data is None:  # the pidfd: the process exited
                self.selector.unregister(key.fd)
                continue
            got_output |= self._read(key.fd, key.data)
        return got_output

    def _read(self, fd: int, tail: _Tail) -> bool:
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return False
        if not chunk:
            self.selector.unregister(fd)
            self.open_streams -= 1
            return False
        tail.add(chunk)
        if self.sink is not None:
            self.sink.write(chunk)
        return True

    def close(self) -> None:
        """Collect what is left in the pipes without blocking, then release every descriptor."""
        for key in list(self.selector.get_map().values()):
            if key.data is not None:
                # bounded: a background writer that holds the pipe must not keep us here
                for _ in range(_FINAL_READS):
                    if not self._read(key.fd, key.data):
                        break
        self.selector.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _safe_activity(activity: Callable[[], float]) -> float:
    """A failing activity probe must not kill the agent; it just reports nothing new."""
    try:
        return float(activity())
    except Exception:
        return float("-inf")


def _kill_tree(proc: subprocess.Popen[bytes], exec_id: str, grace_s: float) -> None:
    """SIGTERM, then SIGKILL, the command's group, its descendants and its escaped daemons."""
    members: dict[int, psutil.Process] = {}
    try:
        leader = psutil.Process(proc.pid)
        members[leader.pid] = leader
        members.update((c.pid, c) for c in leader.children(recursive=True))
    except psutil.Error:
        pass
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        members.update((p.pid, p) for p in _tagged_processes(EXEC_TAG, exec_id))
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)
        _signal_all(members.values(), sig)
        if not _wait_gone(members.values(), wait_s, proc):
            return


def _wait_gone(
    procs: Iterable[psutil.Process],
    timeout: float,
    child: subprocess.Popen[bytes] | None = None,
) -> list[psutil.Process]:
    """Poll until every process is gone (zombies count as gone); return the survivors.

    Not psutil.wait_procs: it would reap our own child behind subprocess's back and lose its
    exit status.
    """
    end = time.monotonic() + max(0.0, timeout)
    pending = list(procs)
    while True:
        if child is not None:
            child.poll()
        pending = [p for p in pending if not _is_gone(p)]
        if not pending or time.monotonic() >= end:
            return pending
        time.sleep(0.01)


def _is_gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE or not proc.is_running()
    except psutil.Error:
        return True


def _signal_all(procs: Iterable[psutil.Process], sig: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)  # psutil checks that the pid was not reused


def _tagged_processes(name: str, value: str) -> list[psutil.Process]:
    """Every live process (other than this one) whose environment holds `name=value`."""
    needle = f"\0{name}={value}\0".encode()
    me = os.getpid()
    found: list[psutil.Process] = []
    for pid in psutil.pids():
        if pid == me:
            continue
        environ = _environ_bytes(pid)
        if environ is None or needle not in b"\0" + environ + b"\0":
            continue
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return found


def _environ_bytes(pid: int) -> bytes | None:
    """The raw initial environment of a process; reading /proc directly avoids dict building."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
    except OSError:
        return None
    try:  # no procfs: let psutil find the environment
        return b"\0".join(f"{k}={v}".encode() for k, v in psutil.Process(pid).environ().items())
    except psutil.Error:
        return None


def _rlimit_setter(limits: ResourceLimits) -> Callable[[], None] | None:
    """Plan the setrlimit calls in the parent so the forked child only makes syscalls."""
    plan: list[tuple[int, tuple[int, int]]] = []
    wanted = (
        (resource.RLIMIT_AS, limits.memory_mb and limits.memory_mb * 1024 * 1024, 0),
        # one second of headroom: SIGXCPU at the soft limit lets a program report before SIGKILL
        (resource.RLIMIT_CPU, limits.cpu_seconds, 1),
        (resource.RLIMIT_NOFILE, limits.max_open_files, 0),
    )
    for res, value, headroom in wanted:
        if not value:
            continue
        _, hard = resource.getrlimit(res)
        new_hard = value + headroom
        if hard != resource.RLIM_INFINITY:
            new_hard = min(new_hard, hard)
        plan.append((res, (min(value, new_hard), new_hard)))
    if not plan:
        return None

    def apply() -> None:
        for res, pair in plan:
            resource.setrlimit(res, pair)

    return apply


def _limits_dict(limits: ResourceLimits) -> dict[str, Any]:
    return {
        "memory_mb": limits.memory_mb,
        "cpu_seconds": limits.cpu_seconds,
        "max_open_files": limits.max_open_files,
    }


def _open_sink(path: Path | None) -> IO[bytes] | None:
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "wb")  # closed by exec() in a finally block


def _atomic_write(path: Path, data: bytes) -> None:
    """Readers in other processes see the old file or the new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _strict() -> bool:
    """Production refuses what development only warns about."""
    from polar_mq.config import get_settings

    return get_settings().is_production


def _raise_on_survivors(runtime_id: str, survivors: list[int]) -> None:
    if survivors:
        raise RuntimeError(f"runtime {runtime_id}: processes survived SIGKILL: {survivors}")
