"""`python -m <module>` processes forked from a pre-imported server instead of exec'd.

A polar_mq process exec'd from scratch spends about a CPU-second importing Celery, SQLAlchemy,
FastAPI, redis and pydantic before it does anything: a node's four stage workers, a local stack's
API, proxy and supervisor each pay it, and a stage worker pays it again every time it restarts.
Forked from multiprocessing's fork server, which has imported those modules once, a process pays
only its own start-up, and the imported code stays shared copy-on-write.

Why the fork server and not a plain fork of the caller: the callers run threads (the supervisor's
janitor and metrics, a test's clients), and forking a threaded process can copy a lock another
thread holds. The fork server is a single-threaded process started by exec. A forked child takes
the environment, command line (as its process title), process group and log file that exec would
have given it, then runs the module as `python -m` does (`__main__`, `sys.argv`, exit handlers).

Some modules read the environment once, at import (prometheus_client's multiprocess mode), and
the import path decides which code there is to import: a child whose `PROMETHEUS_MULTIPROC_DIR`
differs from the fork server's, or whose `PYTHONPATH` names a directory it does not import from,
is exec'd instead (`can_fork`), and the supervisor gives the fork server its stage workers'
environment first.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from multiprocessing.context import ForkContext, ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Protocol

from setproctitle import setproctitle

IMPORT_TIME_ENV = ("PROMETHEUS_MULTIPROC_DIR", "PYTHONHOME", "PYTHONSAFEPATH")
"""Variables read at import by a module the fork server may hold, or that choose which code is
imported at all: children must match it (`PYTHONPATH`: `_imports_what_we_hold`)."""

_contexts: dict[str, ForkServerContext | ForkContext] = {
    "forkserver": multiprocessing.get_context("forkserver"),
    "fork": multiprocessing.get_context("fork"),
}


class ChildProcess(Protocol):
    """What `subprocess.Popen` and `ForkedProcess` share: how callers watch and stop a child."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    def poll(self) -> int | None: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...


def preload(modules: Iterable[str], env: Mapping[str, str] | None = None) -> None:
    """What the fork server imports when it starts, and (`env`) the environment it starts with.

    The server starts at the first fork and lives as long as this process: the first call wins.
    `env` is applied to this process too (the server inherits it); give the environment of the
    children, so that what the server imports reads what they would have read."""
    if env is not None:
        os.environ.update(env)
    _contexts["forkserver"].set_forkserver_preload(list(modules))


def single_threaded() -> bool:
    """Whether this process runs one thread (C threads included): then a plain fork of it is
    safe, and cheaper than the fork server when this process has already imported the code."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def can_fork(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether `argv` is `python -m <module> …` of this interpreter, with the import-time
    environment of this process (the fork server's)."""
    return (
        len(argv) >= 3
        and argv[0] == sys.executable
        and argv[1] == "-m"
        and all(env.get(name) == os.environ.get(name) for name in IMPORT_TIME_ENV)
        and _imports_what_we_hold(env.get("PYTHONPATH", ""))
    )


def _imports_what_we_hold(pythonpath: str) -> bool:
    """Whether a child given `pythonpath` finds its code where this process does: the same value,
    or only directories already on this process's import path, which the fork server was given
    (a benchmark's `PYTHONPATH` of an older revision's tree is not: forked, it would run this
    checkout's modules, which the fork server holds)."""
    if pythonpath == os.environ.get("PYTHONPATH", ""):
        return True
    held = {os.path.realpath(entry or os.curdir) for entry in sys.path}
    wanted = [entry for entry in pythonpath.split(os.pathsep) if entry]
    return all(os.path.realpath(entry) in held for entry in wanted)


def _run_module(
    argv: Sequence[str], env: Mapping[str, str], log_path: str | None, new_session: bool
) -> None:
    """The child: what exec would have set up, then the module as `python -m` runs it."""
    # first: setproctitle takes over the command line's memory on its first call; SPT_NOENV
    # keeps it off the environment's, which `/proc/<pid>/environ` readers (tests' reaper) need
    os.environ["SPT_NOENV"] = "1"
    setproctitle(" ".join(argv))  # what `ps` and process lookups see for an exec'd child
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a fresh interpreter's handlers,
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not those of the process it was forked from
    if new_session:
        os.setsid()
    if log_path is not None:
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    from polar_mq.config import get_settings

    get_settings.cache_clear()  # nothing the fork server may have read stays cached
    sys.argv = [argv[2], *argv[3:]]
    try:
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    finally:
        atexit._run_exitfuncs()  # multiprocessing ends its children with os._exit


_starting = threading.Lock()


@contextmanager
def _main_module_hidden() -> Iterator[None]:
    """While a child starts, `__main__` is a module without a file or name to re-import.

    multiprocessing re-imports the caller's `__main__` in each child so that objects pickled
    from it resolve there. Ours come from this module; and a caller's script without a
    `__name__ == "__main__"` guard would otherwise run again in every child (start its stack)."""
    with _starting:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main


def start_forked(
    target: Callable[..., object], args: tuple[object, ...], name: str, method: str = "forkserver"
) -> BaseProcess:
    """A started multiprocessing child of the fork server (`method="fork"`: of this process)
    running `target(*args)`; arguments are pickled (sockets passed as descriptors)."""
    process = _contexts[method].Process(target=target, args=args, name=name)
    with _main_module_hidden():
        process.start()
    return process


class ForkedProcess:
    """A forked `python -m` child with the part of `subprocess.Popen`'s interface we use."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        log_path: Path | None = None,
        new_session: bool = False,
        method: str = "forkserver",
    ) -> None:
        """`method`: "forkserver", or "fork" of this very process (only when `single_threaded`)."""
        if not can_fork(argv, env):
            raise ValueError(f"cannot fork {argv[:3]}: not `python -m` with this environment")
        self.args = list(argv)
        log = None if log_path is None else str(log_path)
        self._process = start_forked(
            _run_module, (self.args, dict(env), log, new_session), argv[2], method
        )
        if new_session:
            self._wait_until_it_leads_its_group()

    def _wait_until_it_leads_its_group(self, timeout_s: float = 30.0) -> None:
        """Return once the child has made its own session (its first step), as `Popen` with
        `start_new_session` does: a stop sent to its group before that reached nobody, and the
        child lived on (a demo stopped while it started its first service, under load)."""
        deadline = time.monotonic() + timeout_s
        while self._process.exitcode is None and time.monotonic() < deadline:
            try:
                if os.getpgid(self.pid) == self.pid:
                    return
            except ProcessLookupError:
                return  # gone already
            time.sleep(0.001)

    @property
    def pid(self) -> int:
        pid = self._process.pid
        assert pid is not None  # started in __init__
        return pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self._process.kill()

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code
