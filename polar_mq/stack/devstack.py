"""Start polar_mq's processes locally: used by `polar-mq demo`, `polar-mq up`, the end-to-end tests
and the benchmarks, so all of them exercise the very same process layout as production.

Each service is a real subprocess (proxy, API, one Celery worker per stage, Flower, an upstream),
configured only through `POLAR_MQ_*` environment variables, with its output in a log file.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polar_mq.config import Settings
from polar_mq.infra.forking import preload
from polar_mq.infra.processes import ManagedProcess, stop_all, stop_signals_deferred
from polar_mq.lifecycle.stages import Stage
from polar_mq.workers.launcher import DEFAULT_CONCURRENCY, STAGE_WORKER_IMPORTS


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that reproduces `settings` in a child process."""
    env: dict[str, str] = {}
    for name, value in settings.model_dump(mode="json").items():
        if isinstance(value, dict | list):  # e.g. tenant_quotas: JSON, as the settings parse it
            env[f"POLAR_MQ_{name.upper()}"] = json.dumps(value)
        elif value is not None:
            env[f"POLAR_MQ_{name.upper()}"] = str(value)
    return env


SERVICE_IMPORTS = (
    "polar_mq.cli",
    "polar_mq.cli.processes",
    "polar_mq.api.app",
    "polar_mq.proxy.server.app",
    "polar_mq.workers.launcher",
    *STAGE_WORKER_IMPORTS,  # for the supervisor's forks of itself (`launcher.spawn_one`)
    "uvicorn",
)
"""What the fork server imports once for the stack's services (`polar_mq.infra.forking`)."""


class LocalStack:
    """A set of polar_mq processes sharing one configuration; a context manager that stops them.

    Its `python -m` services are forked from a fork server that has imported polar_mq once
    (`fork=False`: each exec'd), which saves each of them about a second of start-up CPU."""

    def __init__(
        self,
        settings: Settings,
        log_dir: Path,
        extra_env: Mapping[str, str] | None = None,
        fork: bool = True,
    ):
        self.fork = fork
        if fork:
            preload(SERVICE_IMPORTS)
        self.settings = settings
        self.log_dir = log_dir
        self.env = {**os.environ, **settings_env(settings), **(extra_env or {})}
        self.processes: list[ManagedProcess] = []
        self._starting: list[tuple[ManagedProcess, str]] = []

    def _spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        env = {**self.env, **(env or {})}
        with stop_signals_deferred():  # a stop now finds the process on the list
            proc = ManagedProcess(name, argv, env, self.log_dir, fork=self.fork).start()
            self.processes.append(proc)
        return proc

    def _ready(self, proc: ManagedProcess, health_url: str, wait: bool) -> ManagedProcess:
        """Wait for `proc` to answer at `health_url` now, or (`wait=False`) in `wait_ready()`."""
        if wait:
            proc.wait_http(health_url)
        else:
            self._starting.append((proc, health_url))
        return proc

    def wait_ready(self) -> None:
        """Wait for every service started with `wait=False`: services that do not need each
        other at start-up boot side by side instead of one after another."""
        starting, self._starting = self._starting, []
        for proc, health_url in starting:
            proc.wait_http(health_url)

    def fake_upstream(self, port: int, *, wait: bool = True, **latency: Any) -> ManagedProcess:
        argv = [sys.executable, "-m", "polar_mq.testing.fake_vllm", "--port", str(port)]
        for key, value in latency.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        proc = self._spawn("fake-upstream", argv)
        return self._ready(proc, f"http://127.0.0.1:{port}/health", wait)

    def proxy(self, *, wait: bool = True) -> ManagedProcess:
        proc = self._spawn("proxy", [sys.executable, "-m", "polar_mq.cli", "proxy"])
        return self._ready(proc, f"{self.settings.proxy_base_url}/healthz", wait)

    def api(self, *, wait: bool = True) -> ManagedProcess:
        proc = self._spawn("api", [sys.executable, "-m", "polar_mq.cli", "api"])
        health = f"http://{self.settings.api_host}:{self.settings.api_port}/healthz"
        return self._ready(proc, health, wait)

    def workers(
        self,
        stages: Sequence[Stage] = tuple(Stage),
        concurrency: Mapping[Stage, int] | None = None,
        pool_impl: str = "threads",
        one_supervisor: bool = False,
    ) -> list[ManagedProcess]:
        """A `polar-mq worker` supervisor per stage (it restarts its Celery worker if it dies), or
        with `one_supervisor` a single one for every stage (as on a host): the same Celery worker
        per stage, three Python processes and their start-up CPU fewer (tests, the demo)."""
        counts = {**DEFAULT_CONCURRENCY, **(concurrency or {})}
        groups = [list(stages)] if one_supervisor else [[stage] for stage in stages]
        procs = []
        for group in groups:
            argv = [
                sys.executable, "-m", "polar_mq.cli", "worker",
                "--stages", ",".join(s.value for s in group),
                # every stage's count, not only the group's: the prepare worker's admission
                # window defaults to the node's run_agent concurrency (workers.admission)
                "--concurrency", ",".join(f"{s.value}={n}" for s, n in counts.items()),
                "--pool-impl", pool_impl, "--no-janitor", "--no-warm-pool",
            ]  # fmt: skip
            name = group[0].value if len(group) == 1 else "stages"
            procs.append(self._spawn(f"worker-{name}", argv))
        return procs

    def node(
        self,
        name: str,
        concurrency: Mapping[Stage, int] | None = None,
        drain_timeout_s: float | None = None,
        pool_impl: str = "threads",
        janitor: bool = True,
        stop_grace_s: float | None = None,
    ) -> ManagedProcess:
        """One more node in the pool: a single `polar-mq worker` for every stage, as on a host.

        It takes prepares from the pool-wide queue and serves its own run agent and evaluate
        queues; `drain(proc)` (SIGTERM to the supervisor only) makes it leave the pool.
        """
        counts = {**DEFAULT_CONCURRENCY, **(concurrency or {})}
        argv = [
            sys.executable, "-m", "polar_mq.cli", "worker", "--node", name,
            "--concurrency", ",".join(f"{s.value}={n}" for s, n in counts.items()),
            "--pool-impl", pool_impl, "--janitor" if janitor else "--no-janitor",
        ]  # fmt: skip
        if drain_timeout_s is not None:
            argv += ["--drain-timeout", str(drain_timeout_s)]
        if stop_grace_s is not None:
            argv += ["--stop-grace", str(stop_grace_s)]
        return self._spawn(f"node-{name}", argv, {"POLAR_MQ_NODE_NAME": name})

    @staticmethod
    def drain(proc: ManagedProcess) -> None:
        """Start draining a node: SIGTERM to its supervisor only, as `docker stop` sends it.

        (Signalling the whole process group would warm-stop every stage worker at once.)
        """
        if proc.alive():
            os.kill(proc.pid, signal.SIGTERM)

    def warm_pool(self, agent_slots: int = DEFAULT_CONCURRENCY[Stage.RUN_AGENT]) -> ManagedProcess:
        """The node's warm-pool refiller (`workers()` runs the stages with `--no-warm-pool`)."""
        argv = [
            sys.executable, "-m", "polar_mq.cli", "warm-pool", "--agent-slots", str(agent_slots),
        ]  # fmt: skip
        return self._spawn("warm-pool", argv)

    def janitor(self, interval_s: float = 1.0) -> ManagedProcess:
        argv = [sys.executable, "-m", "polar_mq.cli", "janitor", "--interval", str(interval_s)]
        return self._spawn("janitor", argv)

    def sweeper(self, interval_s: float | None = None) -> ManagedProcess:
        argv = [sys.executable, "-m", "polar_mq.cli", "sweeper"]
        if interval_s is not None:
            argv += ["--interval", str(interval_s)]
        return self._spawn("sweeper", argv)

    def flower(self, port: int) -> ManagedProcess:
        proc = self._spawn(
            "flower",
            [sys.executable, "-m", "polar_mq.cli", "flower", "--port", str(port)],
        )
        proc.wait_http(f"http://127.0.0.1:{port}/healthcheck")
        return proc

    def stop(self) -> None:
        """Stop every service at once (a stack's teardown takes its slowest warm shutdown, not
        the sum of them)."""
        stop_all(self.processes)

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
