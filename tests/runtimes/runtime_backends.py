"""What the runtime tests share: one `Backend` per runtime kind, process and network helpers.

A `Backend` makes runtimes of its kind under a test's root, remembers them, and on teardown stops
each and checks that nothing is left: no process, no directory, no container, no cgroup. Kinds
whose engine is missing are skipped with the reason and the command that installs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import psutil
import pytest

from polar_mq.runtimes import Runtime, get_runtime

TEST_IMAGE = "polar-mq-runtime:test"
KINDS = ("local", "bwrap", "docker")


@cache
def skip_reason(kind: str) -> str | None:
    """Why runtimes of `kind` cannot run on this machine, or None."""
    if kind == "bwrap":
        from polar_mq.runtimes.bwrap import bwrap_available

        return bwrap_available()
    if kind == "docker":
        from polar_mq.runtimes.docker import default_client, docker_available

        reason = docker_available()
        if reason is not None:
            return reason
        if not default_client().images.list(name=TEST_IMAGE):
            return f"image {TEST_IMAGE} missing: run scripts/build_test_image.sh"
    return None


@dataclass
class Backend:
    """Makes runtimes of one kind; `python` is an interpreter that exists inside its sandboxes.

    Runtime ids get a per-test suffix (`rid`): processes are tagged by id alone, so two test
    sessions on one machine must never share one.
    """

    kind: str
    root: Path
    made: list[Runtime] = field(default_factory=list)
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def rid(self, name: str) -> str:
        return f"{name}-{self.suffix}"

    @property
    def python(self) -> str:
        if self.kind == "docker":
            return "python3"
        # bwrap mounts its own /tmp: a venv under /tmp (a CI checkout) is not visible inside,
        # while the interpreter it links to (the system's, read-only) is.
        return os.path.realpath(sys.executable) if self.kind == "bwrap" else sys.executable

    def options(self, **extra: Any) -> dict[str, Any]:
        """Constructor options of this kind (docker needs its image)."""
        base: dict[str, Any] = {"image": TEST_IMAGE} if self.kind == "docker" else {}
        return {**base, **extra}

    def make(self, name: str, limits: Any = None, **extra: Any) -> Runtime:
        options = self.options(kill_grace_s=0.3, **extra)
        rt = get_runtime(self.kind, self.rid(name), self.root, limits, **options)
        self.made.append(rt)
        return rt

    def handle(self, name: str) -> Runtime:
        """A fresh handle on an existing runtime, as another stage would build it."""
        return get_runtime(self.kind, self.rid(name), self.root, None)

    def cleanup(self) -> None:
        for rt in self.made:
            rt.stop()
            assert_no_trace(rt)


def assert_no_trace(rt: Runtime) -> None:
    """Nothing of the runtime is left on the node."""
    assert rt.alive_processes() == []
    path = getattr(rt, "path", None)
    assert path is None or not path.exists()
    container = getattr(rt, "container", None)
    if container is not None:
        assert container() is None
    cgroup = getattr(rt, "cgroup", None)
    if cgroup is not None:
        assert not cgroup.exists()


@contextlib.contextmanager
def backend_for(kind: str, root: Path) -> Iterator[Backend]:
    reason = skip_reason(kind)
    if reason is not None:
        pytest.skip(f"{kind} runtime unavailable: {reason}")
    backend = Backend(kind, root)
    try:
        yield backend
    finally:
        backend.cleanup()


def gone(pid: int) -> bool:
    """Dead or a zombie (this container's init may not reap orphans)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for(predicate: Any, timeout: float = 30.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout}s")


@contextlib.contextmanager
def tcp_listener() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that answers b"pong" to every connection; yields its port."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"pong")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        server.close()


def connect_command(python: str, port: int) -> list[str]:
    """A command that prints what a TCP connection to 127.0.0.1:port gives, or the error name."""
    code = (
        "import socket, sys\n"
        "try:\n"
        f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
        "    print('got', s.recv(4).decode())\n"
        "except OSError as exc:\n"
        "    print('failed', type(exc).__name__)\n"
    )
    return [python, "-c", code]


# Runs in a separate process: start a runtime, leave a background process and a running exec,
# report ready, then wait to be killed with -9 like a worker.
STARTER = """
import json, sys
from pathlib import Path
from polar_mq.runtimes import get_runtime
kind, runtime_id, root, options = sys.argv[1:5]
rt = get_runtime(kind, runtime_id, Path(root), None, **json.loads(options))
rt.start()
rt.exec("sleep 300 > /dev/null 2>&1 &")
rt.exec("touch ready; exec sleep 300", timeout=600)
"""

# Runs in a separate process: re-attach by id, exec or stop, print a JSON answer.
REATTACH = """
import json, sys
from pathlib import Path
from polar_mq.runtimes import get_runtime
kind, runtime_id, root, action = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
rt = get_runtime(kind, runtime_id, root, None)
if action == "stop":
    rt.stop()
    print(json.dumps({"alive": rt.alive_processes()}))
else:
    result = rt.exec(action)
    print(json.dumps({"exit_code": result.exit_code, "stdout": result.stdout_tail}))
"""


def run_python(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )


def start_in_subprocess(backend: Backend, name: str) -> subprocess.Popen[bytes]:
    """Start runtime `name` from another process and return that process once the exec runs."""
    runtime_id = backend.rid(name)
    options = json.dumps(backend.options())
    proc = subprocess.Popen(
        [sys.executable, "-c", STARTER, backend.kind, runtime_id, str(backend.root), options],
        stdout=subprocess.DEVNULL,
    )
    ready = backend.root / runtime_id / "workspace" / "ready"
    wait_for(lambda: ready.exists() or proc.poll() is not None, what=f"{ready}")
    assert proc.poll() is None, "the starter process died before the runtime was ready"
    return proc
