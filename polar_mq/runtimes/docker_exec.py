"""One `docker exec` with the semantics of `Runtime.exec`: tails, log file, deadlines, kill.

The docker SDK's exec stream blocks, so a reader thread moves its demultiplexed chunks to a queue
and the caller's thread keeps the clocks (wall-clock timeout, inactivity with an external activity
probe). Docker has no "kill this exec" call: on expiry the exec's processes are found among the
container's processes (host pids from the engine's `top`) by the exec tag in their environment,
frozen, and killed from the host; rescans catch children forked meanwhile. That needs the engine
on this node, which the workspace bind mount needs anyway.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

import psutil
from docker.errors import APIError, NotFound

from polar_mq.runtimes.base import ExecRequest, ExecResult
from polar_mq.runtimes.process_kit import (
    Tail,
    Watchdog,
    environ_bytes,
    open_sink,
    signal_all,
    wait_gone,
)

log = logging.getLogger(__name__)
_POLL_S = 0.2  # how often a silent exec is asked whether it has exited
_EOF = None


class StreamPump:
    """Reads an exec's output on a thread; the caller waits on `next_chunk` with a timeout."""

    def __init__(self, stream: Any, sink: IO[bytes] | None) -> None:
        self.stream = stream
        self.sink = sink
        self.stdout = Tail()
        self.stderr = Tail()
        self.eof = False
        self.error: Exception | None = None
        """What ended the stream other than its end (a closed socket, a framing error)."""
        self._queue: queue.SimpleQueue[tuple[bytes | None, bytes | None] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._read, name="docker-exec-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for frame in self.stream:
                self._queue.put(frame)
        except Exception as exc:  # a closed socket ends the stream like EOF
            self.error = exc
        finally:
            self._queue.put(_EOF)

    def wait(self, timeout: float) -> bool:
        """Take output for up to `timeout` seconds; True when some arrived."""
        got = False
        try:
            item = self._queue.get(timeout=max(0.0, timeout)) if not self.eof else _EOF
        except queue.Empty:
            return False
        while True:
            if item is _EOF:
                self.eof = True
                return got
            got |= self._take(item)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return got

    def _take(self, frame: tuple[bytes | None, bytes | None]) -> bool:
        out, err = frame
        for chunk, tail in ((out, self.stdout), (err, self.stderr)):
            if chunk:
                tail.add(chunk)
                if self.sink is not None:
                    self.sink.write(chunk)
        return bool(out or err)

    def close(self, join_s: float = 2.0) -> None:
        """Stop reading (a background process may hold the pipe open forever) and drain."""
        with contextlib.suppress(Exception):
            self.stream.close()
        self._thread.join(join_s)
        while not self.eof:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _EOF:
                self.eof = True
            else:
                self._take(item)


def supervise(
    pump: StreamPump,
    running: Callable[[], bool],
    timeout: float | None,
    inactivity_timeout: float | None,
    activity: Callable[[], float] | None,
    drain_s: float,
) -> str | None:
    """Return "timeout" or "inactive" when the exec must be killed, None when it ended."""
    watchdog = Watchdog.start(timeout, inactivity_timeout, activity)
    exited_at: float | None = None
    last_poll = time.monotonic()
    while True:
        now = time.monotonic()
        if pump.eof:
            return None
        if exited_at is None and now - last_poll >= _POLL_S:
            last_poll = now
            if not running():
                exited_at = now
        if exited_at is not None:
            if now >= exited_at + drain_s:
                return None
            wake = exited_at + drain_s
        else:
            verdict, wake = watchdog.check(now)
            if verdict is not None:
                return verdict
            wake = min(wake, last_poll + _POLL_S)
        if pump.wait(wake - now):
            watchdog.saw_output()


def run_exec(
    api: Any,
    container_id: str,
    argv: list[str],
    request: ExecRequest,
    *,
    environment: Mapping[str, str],
    workdir: str,
    user: str,
    tag: str,
    drain_s: float,
    kill_grace_s: float,
) -> ExecResult:
    """Run `argv` (the request's, or a relay around it) in the container as `user` with the
    request's clocks and log file, to completion, or kill it on expiry.

    `tag` (`NAME=value`) is in `environment` and marks the exec's processes for the kill."""
    started = time.monotonic()
    handle = api.exec_create(
        container_id, argv, environment=dict(environment), workdir=workdir, user=user
    )["Id"]
    sink = open_sink(request.stdout_path)
    reason: str | None = None
    try:
        pump = StreamPump(api.exec_start(handle, stream=True, demux=True), sink)
        try:
            reason = supervise(
                pump,
                lambda: bool(api.exec_inspect(handle).get("Running")),
                request.timeout,
                request.inactivity_timeout,
                request.activity,
                drain_s,
            )
        finally:
            if reason is not None or api.exec_inspect(handle).get("Running"):
                kill_exec(api, container_id, tag, kill_grace_s)
            pump.close()
    finally:
        if sink is not None:
            sink.close()
    exit_code = api.exec_inspect(handle).get("ExitCode")
    if pump.error is not None and reason is None:
        # kept for the record: an exec whose output came back empty once in CI (a missing
        # program, exit 126, without the engine's message) left nothing to tell why
        log.warning("docker exec %s: its output stream ended on %r", handle[:12], pump.error)
    return ExecResult(
        exit_code=None if reason else exit_code,
        stdout_tail=pump.stdout.text(),
        stderr_tail=pump.stderr.text(),
        timed_out=reason == "timeout",
        inactive=reason == "inactive",
        duration_s=time.monotonic() - started,
    )


def container_pids(api: Any, container_id: str) -> list[int]:
    """Host pids of a container's processes (empty when it is gone or stopped)."""
    try:
        top = api.top(container_id)
    except (NotFound, APIError):
        return []
    titles = top.get("Titles") or []
    if "PID" not in titles:
        return []
    column = titles.index("PID")
    return [int(row[column]) for row in top.get("Processes") or []]


def tagged_in_container(api: Any, container_id: str, needle: str) -> Iterator[psutil.Process]:
    """The container's processes whose environment holds `needle` (`NAME=value`)."""
    wanted = f"\0{needle}\0".encode()
    for pid in container_pids(api, container_id):
        environ = environ_bytes(pid)
        if environ is None or wanted not in b"\0" + environ + b"\0":
            continue
        with contextlib.suppress(psutil.Error):
            yield psutil.Process(pid)


def kill_exec(api: Any, container_id: str, needle: str, grace_s: float) -> list[int]:
    """SIGTERM, grace, then freeze-and-SIGKILL every process of one exec; return survivors."""
    members = {p.pid: p for p in tagged_in_container(api, container_id, needle)}
    signal_all(members.values(), signal.SIGTERM)
    wait_gone(members.values(), grace_s)
    end = time.monotonic() + 10.0
    frozen: dict[int, psutil.Process] = {}
    while time.monotonic() < end:
        found = {p.pid: p for p in tagged_in_container(api, container_id, needle)}
        new = {pid: p for pid, p in found.items() if pid not in frozen}
        if not new:
            if not frozen:
                return []
            signal_all(frozen.values(), signal.SIGKILL)
            frozen = {p.pid: p for p in wait_gone(frozen.values(), end - time.monotonic())}
            continue
        signal_all(new.values(), signal.SIGSTOP)
        frozen.update(new)
    return sorted(frozen)
