"""The process toolkit every runtime builds on: supervise a command, kill a tree, find tagged
processes, set resource limits.

A runtime's processes are found by an environment tag (`RUNTIME_TAG=<runtime id>`, and
`EXEC_TAG=<exec id>` per command) that every descendant inherits, so any worker process can find
and kill them, daemons that left their session included. The supervisor pumps a command's pipes
without ever blocking on a full one and decides when it must die (deadline, inactivity).
These are public so the sibling runtimes (`local`, `bwrap`, `docker`) share one implementation.
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

from polar_mq.runtimes.base import ResourceLimits

RUNTIME_TAG = "POLAR_MQ_RUNTIME_ID"
EXEC_TAG = "POLAR_MQ_EXEC_ID"
TAIL_BYTES = 8192
_READ_CHUNK = 65536
_FINAL_READS = 16


class Tail:
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


class Supervisor:
    """Pumps a process's pipes and decides when it has to die; never blocks on a full pipe.

    Event driven: it sleeps in select until output arrives, the process exits (a pidfd where the
    kernel has one, else a short poll) or a deadline passes.
    """

    def __init__(self, proc: subprocess.Popen[bytes], sink: IO[bytes] | None, drain_s: float):
        assert proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.sink = sink
        self.drain_s = drain_s
        self.stdout = Tail()
        self.stderr = Tail()
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
        watchdog = Watchdog.start(timeout, inactivity_timeout, activity)
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
                verdict, wake = watchdog.check(now)
                if verdict is not None:
                    return verdict
                if self.pidfd is None:
                    wake = min(wake, now + 0.1)
            if self._pump(max(0.0, wake - now)):
                watchdog.saw_output()

    def _pump(self, wait: float) -> bool:
        """Wait up to `wait` seconds for events; return True when output arrived."""
        got_output = False
        for key, _ in self.selector.select(wait if wait != float("inf") else None):
            if key.data is None:  # the pidfd: the process exited
                self.selector.unregister(key.fd)
                continue
            got_output |= self._read(key.fd, key.data)
        return got_output

    def _read(self, fd: int, tail: Tail) -> bool:
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


@dataclass(slots=True)
class Watchdog:
    """When a running exec must die (its deadline, or no sign of life for `inactivity_s`) and
    when to look again: the one decision the host and the docker supervisors share."""

    deadline: float
    inactivity_s: float | None
    activity: Callable[[], float] | None
    last_seen: float

    @classmethod
    def start(
        cls,
        timeout: float | None,
        inactivity_s: float | None,
        activity: Callable[[], float] | None,
    ) -> Watchdog:
        now = time.monotonic()
        deadline = now + timeout if timeout is not None else float("inf")
        return cls(deadline, inactivity_s, activity, now)

    def check(self, now: float) -> tuple[str | None, float]:
        """("timeout" or "inactive", now) when the exec must be killed; else (None, the time to
        look again). Output is one sign of life (`saw_output`); `activity` (e.g. the rollout's
        last proxied call) another, asked only once the output alone says inactive."""
        if now >= self.deadline:
            return "timeout", now
        wake = self.deadline
        if self.inactivity_s is not None:
            if now >= self.last_seen + self.inactivity_s and self.activity is not None:
                self.last_seen = max(self.last_seen, safe_activity(self.activity))
            if now >= self.last_seen + self.inactivity_s:
                return "inactive", now
            wake = min(wake, self.last_seen + self.inactivity_s)
        return None, wake

    def saw_output(self) -> None:
        self.last_seen = time.monotonic()


def safe_activity(activity: Callable[[], float]) -> float:
    """A failing activity probe must not kill the agent; it just reports nothing new."""
    try:
        return float(activity())
    except Exception:
        return float("-inf")


def kill_tree(proc: subprocess.Popen[bytes], exec_id: str, grace_s: float) -> None:
    """SIGTERM, then SIGKILL, the command's group, its descendants and its escaped daemons."""
    members: dict[int, psutil.Process] = {}
    try:
        leader = psutil.Process(proc.pid)
        members[leader.pid] = leader
        members.update((c.pid, c) for c in leader.children(recursive=True))
    except psutil.Error:
        pass
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        members.update((p.pid, p) for p in tagged_processes(EXEC_TAG, exec_id))
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)
        signal_all(members.values(), sig)
        if not wait_gone(members.values(), wait_s, proc):
            return


def wait_gone(
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
        pending = [p for p in pending if not is_gone(p)]
        if not pending or time.monotonic() >= end:
            return pending
        time.sleep(0.01)


def is_gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE or not proc.is_running()
    except psutil.Error:
        return True


def signal_all(procs: Iterable[psutil.Process], sig: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)  # psutil checks that the pid was not reused


def tagged_processes(
    name: str, value: str, uids: Collection[int] | None = None
) -> list[psutil.Process]:
    """Every live process (other than this one) whose environment holds `name=value`.

    `uids`: look only at processes owned by these users (the owner of `/proc/<pid>`: the
    effective uid, root for a process that ran a setuid program). A stat is a third of an
    environment read, and on a busy node most processes are other rollouts' agents, each under
    its own uid: the scan then reads the environments of the few that may be this runtime's."""
    needle = f"\0{name}={value}\0".encode()
    me = os.getpid()
    found: list[psutil.Process] = []
    for pid in psutil.pids():
        if pid == me or (uids is not None and not _owned_by(pid, uids)):
            continue
        environ = environ_bytes(pid)
        if environ is None or needle not in b"\0" + environ + b"\0":
            continue
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return found


def _owned_by(pid: int, uids: Collection[int]) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid in uids
    except FileNotFoundError:  # gone; or no procfs, and the environment decides
        return not os.path.isdir("/proc/self")
    except OSError:
        return True


def environ_bytes(pid: int) -> bytes | None:
    """The raw initial environment of a process; reading /proc directly avoids dict building.

    With `os.open`/`os.read`, not `open()`: a runtime's stop reads every process's environment
    of the node (`tagged_processes`), and a buffered file object per process cost half of it."""
    try:
        return _read_all(f"/proc/{pid}/environ")
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
    except OSError:
        return None
    try:  # no procfs: let psutil find the environment
        return b"\0".join(f"{k}={v}".encode() for k, v in psutil.Process(pid).environ().items())
    except psutil.Error:
        return None


def _read_all(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def rlimit_setter(limits: ResourceLimits) -> Callable[[], None] | None:
    """Plan the setrlimit calls in the parent so the forked child only makes syscalls."""
    plan: list[tuple[int, tuple[int, int]]] = []
    wanted = (
        (resource.RLIMIT_AS, limits.memory_mb and limits.memory_mb * 1024 * 1024, 0),
        # one second of headroom: SIGXCPU at the soft limit lets a program report before SIGKILL
        (resource.RLIMIT_CPU, limits.cpu_seconds, 1),
        (resource.RLIMIT_NOFILE, limits.max_open_files, 0),
        (resource.RLIMIT_FSIZE, limits.file_size_mb and limits.file_size_mb * 1024 * 1024, 0),
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


def open_sink(path: Path | None) -> IO[bytes] | None:
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "wb")  # closed by exec() in a finally block


def atomic_write(path: Path, data: bytes) -> None:
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
