"""The runtime interface: a sandbox that one rollout's stages share across processes.

Stages run in different worker processes on the same node, so a `Runtime` object is only a handle:
everything it needs to act on the sandbox (files, processes) must be discoverable from its id and
root alone. Any process may build a handle for an existing id and exec in it, reset it or stop it.
"""

from __future__ import annotations

import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import ClassVar, Self

_RUNTIME_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True, slots=True)
class ExecResult:
    """Outcome of one command; the tails keep memory bounded whatever the command prints.

    `exit_code` is the command's status (negative N: killed by signal N, e.g. a resource limit),
    or None when exec itself killed it (`timed_out` or `inactive`).
    """

    exit_code: int | None
    stdout_tail: str
    stderr_tail: str
    timed_out: bool
    inactive: bool
    duration_s: float

    @property
    def ok(self) -> bool:
        """True when the command ran to completion and exited 0."""
        return self.exit_code == 0 and not self.timed_out and not self.inactive


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """Per-process limits; `None` leaves the worker's own limit in place.

    `memory_mb` bounds the address space (RLIMIT_AS), which is stricter than resident memory:
    runtimes that start JIT-heavy programs need generous values.
    """

    memory_mb: int | None = None
    cpu_seconds: int | None = None
    max_open_files: int | None = None
    file_size_mb: int | None = None
    """The largest file a process may write (RLIMIT_FSIZE): the per-file disk cap."""

    def __post_init__(self) -> None:
        for name in ("memory_mb", "cpu_seconds", "max_open_files", "file_size_mb"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"ResourceLimits.{name} must be a positive int or None")


def check_exec_timeouts(timeout: float | None, inactivity_timeout: float | None) -> None:
    """Refuse non-positive timeouts the same way in every runtime's `exec`."""
    for name, value in (("timeout", timeout), ("inactivity_timeout", inactivity_timeout)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")


@dataclass(frozen=True, slots=True)
class ExecRequest:
    """One command for a runtime, checked once when built: what `Runtime.exec` was asked.

    Every runtime implements one hook, `Runtime._run(request)`, so the arguments of a command and
    their checks are written here only. `command` as a str runs via `/bin/sh -c` (`argv`); a list
    is kept as a tuple and `env` as a read-only copy, so the request cannot change under a runtime.
    """

    command: str | tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    timeout: float | None = None
    inactivity_timeout: float | None = None
    activity: Callable[[], float] | None = None
    stdout_path: Path | None = None

    def __post_init__(self) -> None:
        check_exec_timeouts(self.timeout, self.inactivity_timeout)
        if not isinstance(self.command, str):
            object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env or {})))

    @property
    def argv(self) -> list[str]:
        """The program and its arguments (a str command through the shell)."""
        if isinstance(self.command, str):
            return ["/bin/sh", "-c", self.command]
        return list(self.command)


def validate_runtime_id(runtime_id: str) -> str:
    """Refuse ids that could escape the runtime root once used as a directory name."""
    if not isinstance(runtime_id, str) or not _RUNTIME_ID.fullmatch(runtime_id):
        raise ValueError(
            f"invalid runtime id {runtime_id!r}: use 1-128 characters from [A-Za-z0-9._-], "
            "starting with a letter or digit"
        )
    return runtime_id


class Runtime(ABC):
    """A sandbox: a work directory plus the processes started in it.

    Implementations must be re-attachable: constructing a runtime with the id of an existing one
    (in any process on the node) gives a handle on the same sandbox. `stop()` must be idempotent
    and must leave no process, container or directory behind.
    """

    kind: ClassVar[str]

    def __init__(self, runtime_id: str) -> None:
        self.runtime_id = validate_runtime_id(runtime_id)

    @property
    @abstractmethod
    def workdir(self) -> Path:
        """Directory the agent works in (its `POLAR_WORKDIR`)."""

    @property
    def python(self) -> str:
        """The interpreter that starts Python agents (the reference agent) inside this runtime.

        The worker's own by default: `local` and `bwrap` run the node's files. A container has
        its image's interpreter instead (see `DockerRuntime`).
        """
        return sys.executable

    @abstractmethod
    def start(self) -> None:
        """Create the sandbox; calling it on an existing sandbox is a no-op."""

    def hand_over(self) -> None:
        """Give the agent everything the worker wrote into the workspace (e.g. a checkout).

        Agents run as an unprivileged user (`identity.py`); files the worker made are its own
        until handed over. A no-op for runtimes whose commands run as the worker."""
        return None

    def agent_proxy_url(self, url: str) -> str:
        """The address an agent in this sandbox uses to reach the proxy at `url`.

        `url` itself unless the sandbox's network policy routes the proxy through a relay
        (`network: proxy_only`), which this call also sets up for the commands that follow."""
        return url

    def exec(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        inactivity_timeout: float | None = None,
        activity: Callable[[], float] | None = None,
        stdout_path: Path | None = None,
    ) -> ExecResult:
        """Run a command to completion, or kill its whole process tree on expiry.

        A str command runs via `/bin/sh -c`. `timeout` is wall-clock seconds. With
        `inactivity_timeout`, the command is killed once neither its output nor `activity()`
        (a `time.monotonic()` stamp of the last external sign of life, e.g. the last LLM call)
        has moved for that many seconds. `stdout_path` receives stdout and stderr interleaved.
        Non-positive timeouts are refused (ValueError) before anything runs.
        """
        request = ExecRequest(
            command if isinstance(command, str) else tuple(command),
            env=env or {},
            cwd=cwd,
            timeout=timeout,
            inactivity_timeout=inactivity_timeout,
            activity=activity,
            stdout_path=stdout_path,
        )
        return self._run(request)

    @abstractmethod
    def _run(self, request: ExecRequest) -> ExecResult:
        """Carry out one checked request (the single hook each runtime kind implements)."""

    @abstractmethod
    def upload(self, data: bytes, dest: str) -> None:
        """Write `data` to `dest` (relative paths are relative to the work directory)."""

    @abstractmethod
    def download(self, path: str) -> bytes:
        """Read a file of the sandbox (relative paths are relative to the work directory)."""

    def refuse_links(self, path: str) -> None:
        """Raise `UnsafePath` when a component of `path` is a symlink the agent may have planted
        (checked before the grader acts on a path by a command). Runtimes whose files the worker
        does not see directly have nothing to check here."""
        return None

    @abstractmethod
    def reset(self) -> None:
        """Kill every process and empty the work directory so the sandbox can be reused."""

    @abstractmethod
    def stop(self) -> None:
        """Kill every process and delete the sandbox; safe to call repeatedly, from any process."""

    @abstractmethod
    def alive_processes(self) -> list[int]:
        """Pids of the sandbox's live processes (a leak check for tests and the sweeper)."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
