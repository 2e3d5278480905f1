"""Child processes that polar_mq starts and must stop completely: the local stack's services
(`devstack`) and the local vLLM server (`inference.local_vllm`).

Each child leads its own process group and logs to a file. Stopping signals the whole group and
waits until no member is left — a server's own children (vLLM's engine core, a prefork pool)
would otherwise outlive their leader.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType

import httpx

from polar_mq.infra.forking import ChildProcess, ForkedProcess, can_fork
from polar_mq.infra.tls import client_ssl_context

ZOMBIE_WALK_S = 0.5
"""How often a stop that is waiting for groups walks /proc to tell zombies from live members; in
between, asking the kernel (`group_exists`) is enough to see a group gone. Walking every 50 ms
was a visible share of the test suite's CPU (docs/benchmarks.md)."""


def group_exists(pgid: int) -> bool:
    """Whether process group `pgid` has any process left, zombies included (one system call)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process holds the group
        return True
    return True


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`."""
    return live_groups([pgid]).get(pgid, [])


def live_groups(pgids: Sequence[int]) -> dict[int, list[int]]:
    """Live (non-zombie) members of each process group in `pgids`, groups with none left absent.

    One walk of /proc for all of them: a walk costs a few milliseconds of CPU on a busy machine
    (see `ZOMBIE_WALK_S` for how often a stop walks)."""
    wanted = set(pgids)
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: ask the kernel whether anyone is left in each group
        alive: dict[int, list[int]] = {}
        for pgid in wanted:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                continue
            alive[pgid] = [pgid]
        return alive
    members: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X") and int(fields[2]) in wanted:
            members.setdefault(int(fields[2]), []).append(int(entry.name))
    return members


class ManagedProcess:
    """A child process in its own process group, logging to a file, stopped with its whole tree."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_dir: Path,
        *,
        log_path: Path | None = None,
        fork: bool = False,
    ) -> None:
        self.name = name
        self.fork = fork
        """Fork a `python -m` child from the pre-imported server (`polar_mq.infra.forking`)."""
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path or log_dir / f"{name}.log"
        self.proc: ChildProcess | None = None
        self.started_at = 0.0
        self._log_offset = 0

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            log.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(self.argv)}\n".encode())
            log.flush()
            self.started_at = time.monotonic()
            if self.fork and can_fork(self.argv, self.env):
                self.proc = ForkedProcess(
                    self.argv, self.env, log_path=self.log_path, new_session=True
                )
                return self
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        """The end of what this run wrote to the log file."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(self._log_offset, log.tell() - chars))
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 15.0) -> None:
        """Signal the whole group, then SIGKILL what is left after `grace_s`; safe to repeat."""
        stop_all([self], sig, grace_s)

    def _signal_group(self, sig: int) -> bool:
        """Send `sig` to the group if anyone is left in it; whether it was sent."""
        if self.proc is None:
            return False
        pgid = self.proc.pid  # start_new_session: the child leads its own group
        if not (group_exists(pgid) or self.proc.poll() is None):
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        return True

    def wait_http(self, url: str, timeout_s: float = 60.0, poll_s: float = 0.1) -> float:
        """Poll `url` until it answers 200 and return the seconds since `start()`; fail fast,
        with the log tail, if the process exits first or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0, verify=client_ssl_context()) as client:
            while True:
                if not self.alive():
                    code = self.proc.returncode if self.proc is not None else None
                    raise RuntimeError(
                        f"{self.name} exited with code {code} before it was ready "
                        f"(log {self.log_path}):\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(url).status_code == 200:
                        return time.monotonic() - self.started_at
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"{self.name} not ready at {url} after {timeout_s:.0f}s "
                        f"(log {self.log_path}):\n{self.log_tail()}"
                    )
                time.sleep(poll_s)


STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


@contextlib.contextmanager
def _stop_handlers(handler: Callable[[int, FrameType | None], object] | int) -> Iterator[None]:
    """SIGTERM and SIGINT go to `handler` for the block, then to what was in place before. A
    Python handler only runs on the main thread: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, signal.SIG_DFL if before is None else before)


@contextlib.contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """Hold SIGTERM and SIGINT back for the block: one that arrives meanwhile is raised again,
    to the handler that was in place, as soon as the block ends.

    Around a child's start and its registration in a stack: a stop that raised between the two
    (the demo's SIGTERM handler exits by raising) left a child that nobody stopped, holding the
    demo's stdout open (a test waiting for the demo's output waited for ever). The handlers are
    swapped, not the signal mask: starting the first forked child starts multiprocessing's
    resource tracker, which unblocks both signals on its way out."""
    caught: list[int] = []
    try:
        with _stop_handlers(lambda signum, _frame: caught.append(signum)):
            yield
    finally:
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


@contextlib.contextmanager
def stop_signals_ignored() -> Iterator[None]:
    """Ignore SIGTERM and SIGINT for the block.

    Around a stop: the demo and `python -m polar_mq.inference.local_vllm` turn SIGTERM into an
    exception, so a second one during their stop (a supervisor forwarding signals, a second
    Ctrl-C) raised in the middle of it: a traceback, and the SIGKILL after the grace skipped,
    which could leave a service running. The stop itself is bounded by its grace. The signal is
    dropped, not deferred: this process is stopping what it started already."""
    with _stop_handlers(signal.SIG_IGN):
        yield


def stop_all(
    processes: Sequence[ManagedProcess], sig: int = signal.SIGTERM, grace_s: float = 15.0
) -> None:
    """Stop several process groups at once: signal every group, wait for them together, SIGKILL
    what is left after `grace_s`. A stack's services shut down in parallel (their warm shutdowns
    overlap) instead of one grace period after another; safe to repeat. A stop signal that
    arrives meanwhile is ignored (`stop_signals_ignored`)."""
    with stop_signals_ignored():
        signalled = [p for p in processes if p._signal_group(sig)]
        if not _wait_gone(signalled, grace_s):
            for proc in signalled:
                proc._signal_group(signal.SIGKILL)
            _wait_gone(signalled, 10.0)
        for proc in processes:
            if proc.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.proc.wait(timeout=5.0)


def _wait_gone(processes: Sequence[ManagedProcess], timeout: float) -> bool:
    """Wait until every group in `processes` is empty; False if some member outlives `timeout`."""
    deadline = time.monotonic() + timeout
    left = [p for p in processes if p.proc is not None]
    next_walk = 0.0
    while True:
        for p in left:
            assert p.proc is not None
            p.proc.poll()  # reap the leader, so that it does not count as a member
        left = [p for p in left if group_exists(p.pid)]
        now = time.monotonic()
        if left and now >= next_walk:  # only zombies may be left, which the kernel still counts
            alive = live_groups([p.pid for p in left])
            left = [p for p in left if p.pid in alive]
            next_walk = now + ZOMBIE_WALK_S
        if not left:
            return True
        if now >= deadline:
            return False
        time.sleep(0.05)
