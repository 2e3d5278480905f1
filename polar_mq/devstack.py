"""Start polar_mq's processes locally: used by `polar-mq demo`, `polar-mq up`, the end-to-end tests
and the benchmarks, so all of them exercise the very same process layout as production.

Each service is a real subprocess (proxy, API, one Celery worker per stage, Flower, an upstream),
configured only through `POLAR_MQ_*` environment variables, with its output in a log file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from polar_mq.config import Settings
from polar_mq.workers.launcher import DEFAULT_CONCURRENCY, plan_workers
from polar_mq.workers.routing import Stage


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that reproduces `settings` in a child process."""
    env: dict[str, str] = {}
    for name, value in settings.model_dump().items():
        if value is not None:
            env[f"POLAR_MQ_{name.upper()}"] = str(value)
    return env


class ManagedProcess:
    """A child process in its own process group, logging to a file, stopped with its whole tree."""

    def __init__(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], log_dir: Path
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
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
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=grace_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def wait_http(self, url: str, timeout_s: float = 60.0) -> None:
        """Poll `url` until it answers 200, failing fast with the log tail if the process died."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited early:\n{self.log_tail()}")
            try:
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready at {url} after {timeout_s}s:\n{self.log_tail()}")


class LocalStack:
    """A set of polar_mq processes sharing one configuration; a context manager that stops them."""

    def __init__(
        self, settings: Settings, log_dir: Path, extra_env: Mapping[str, str] | None = None
    ):
        self.settings = settings
        self.log_dir = log_dir
        self.env = {**os.environ, **settings_env(settings), **(extra_env or {})}
        self.processes: list[ManagedProcess] = []

    def _spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        proc = ManagedProcess(name, argv, {**self.env, **(env or {})}, self.log_dir).start()
        self.processes.append(proc)
        return proc

    def fake_upstream(self, port: int, **latency: Any) -> ManagedProcess:
        argv = [sys.executable, "-m", "polar_mq.testing.fake_vllm", "--port", str(port)]
        for key, value in latency.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        proc = self._spawn("fake-upstream", argv)
        proc.wait_http(f"http://127.0.0.1:{port}/health")
        return proc

    def proxy(self) -> ManagedProcess:
        proc = self._spawn("proxy", [sys.executable, "-m", "polar_mq.cli", "proxy"])
        proc.wait_http(f"{self.settings.proxy_base_url}/healthz")
        return proc

    def api(self) -> ManagedProcess:
        proc = self._spawn("api", [sys.executable, "-m", "polar_mq.cli", "api"])
        proc.wait_http(f"http://{self.settings.api_host}:{self.settings.api_port}/healthz")
        return proc

    def workers(
        self,
        stages: Sequence[Stage] = tuple(Stage),
        concurrency: Mapping[Stage, int] | None = None,
        pool_impl: str = "threads",
    ) -> list[ManagedProcess]:
        plan = plan_workers(
            self.settings, stages, {**DEFAULT_CONCURRENCY, **(concurrency or {})}, pool_impl
        )
        return [self._spawn(f"worker-{w.stage.value}", w.argv()) for w in plan]

    def flower(self, port: int) -> ManagedProcess:
        proc = self._spawn(
            "flower",
            [sys.executable, "-m", "polar_mq.cli", "flower", "--port", str(port)],
        )
        proc.wait_http(f"http://127.0.0.1:{port}/healthcheck")
        return proc

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
