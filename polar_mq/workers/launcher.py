"""`polar-mq worker`: one Celery worker process per stage, each with its own queue and concurrency.

Separate processes per stage give each stage its own concurrency (agent slots vs. prepare slots) and
keep a slow stage from starving the others; they are plain `celery worker` processes, so scaling out
is starting the same command on more nodes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from polar_mq.config import Settings
from polar_mq.infra.forking import ChildProcess, ForkedProcess, preload, single_threaded
from polar_mq.lifecycle.messages import queue_name
from polar_mq.lifecycle.stages import Stage

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = {
    Stage.PREPARE: 2,
    Stage.RUN_AGENT: 8,
    Stage.BUILD: 2,
    Stage.EVALUATE: 2,
}


@dataclass(frozen=True)
class StageWorker:
    stage: Stage
    queue: str
    concurrency: int
    hostname: str
    pool_impl: str
    env: Mapping[str, str] = field(default_factory=dict)
    """What this worker's environment adds to the node's (`worker_env`)."""

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "polar_mq.workers.entry", "worker",
            "-Q", self.queue, "-c", str(self.concurrency), "-P", self.pool_impl,
            "-n", self.hostname, "-O", "fair", "--without-gossip", "--without-mingle",
            "--loglevel", "WARNING",
        ]  # fmt: skip


def parse_concurrency(spec: str | None) -> dict[Stage, int]:
    """`run_agent=8,prepare=2` → {Stage: int}; missing stages keep their defaults."""
    result = dict(DEFAULT_CONCURRENCY)
    if not spec:
        return result
    for part in spec.split(","):
        name, sep, value = part.partition("=")
        try:
            stage = Stage(name.strip())
            count = int(value)
        except ValueError as exc:
            raise ValueError(
                f"bad concurrency {part!r}; expected stage=N, e.g. run_agent=8"
            ) from exc
        if not sep or count < 1:
            raise ValueError(f"bad concurrency {part!r}; N must be ≥ 1")
        result[stage] = count
    return result


def parse_stages(spec: str) -> list[Stage]:
    try:
        return [Stage(s.strip()) for s in spec.split(",") if s.strip()]
    except ValueError as exc:
        raise ValueError(f"unknown stage in {spec!r}; stages: {', '.join(Stage)}") from exc


ADMISSION_WINDOW_ENV = "POLAR_MQ_PREPARE_ADMISSION_WINDOW"


def worker_env(
    settings: Settings, stage: Stage, concurrency: Mapping[Stage, int]
) -> dict[str, str]:
    """The prepare worker's admission window (`workers.admission`) defaults to the node's
    run_agent concurrency, which only the node's launcher knows: it is handed down here."""
    if stage is Stage.PREPARE and settings.prepare_admission_window is None:
        return {ADMISSION_WINDOW_ENV: str(concurrency[Stage.RUN_AGENT])}
    return {}


def plan_workers(
    settings: Settings, stages: Sequence[Stage], concurrency: Mapping[Stage, int], pool_impl: str
) -> list[StageWorker]:
    node = settings.node_name
    return [
        StageWorker(
            stage=stage,
            queue=queue_name(settings.queue_prefix, stage, settings.pool, node),
            concurrency=concurrency[stage],
            hostname=f"{stage.value}.{settings.pool}@{node}",
            pool_impl=pool_impl,
            env=worker_env(settings, stage, concurrency),
        )
        for stage in stages
    ]


START_METHODS = ("forkserver", "exec")
"""How stage workers start: forked from a pre-imported server (`polar_mq.infra.forking`, the
default: a fraction of the CPU of a fresh start, docs/benchmarks.md), or each a fresh `celery
worker` process."""


def check_start_method(start: str) -> str:
    """`start` if it is one of `START_METHODS`; else a ValueError naming them."""
    if start not in START_METHODS:
        raise ValueError(f"unknown start method {start!r}; one of {', '.join(START_METHODS)}")
    return start


STAGE_WORKER_IMPORTS = (
    "polar_mq.cli",  # the `polar-mq` script's module: multiprocessing imports it in each child
    "polar_mq.dispatch.celery_app",
    "polar_mq.workers.tasks",
    "polar_mq.workers.admission_step",
    "celery.bin.celery",
    "celery.apps.worker",
)
"""What the fork server imports for the stage workers. Not `polar_mq.workers.entry`: it builds the
Celery app from the environment at import, which each stage worker does for itself."""


def spawn_one(
    worker: StageWorker, env: Mapping[str, str] | None = None, start: str = "exec"
) -> ChildProcess:
    full = {**(env or os.environ), **worker.env}
    if start == "forkserver":
        # a supervisor without threads (no janitor, metrics or warm pool: local stacks) forks
        # itself, which is cheaper still when it was itself forked with the code imported
        method = "fork" if single_threaded() else "forkserver"
        return ForkedProcess(worker.argv(), full, method=method)
    return subprocess.Popen(worker.argv(), env=full)


RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
HEALTHY_AFTER_S = 60.0
"""A worker that stayed up this long has its restart backoff reset."""
STOP_WAIT_S = 60.0
"""How long a warm shutdown may take before the worker is killed (in-flight stages finish)."""


@dataclass(frozen=True)
class DrainPolicy:
    """How a node leaves its pool on SIGTERM (see `polar_mq.workers.drain`).

    `remaining()` counts the unfinished rollouts on this node; the node is drained when it is 0.
    After `timeout_s` whatever is left is stopped: `kill_grace_s` for a warm shutdown, then
    SIGKILL; those rollouts' leases expire and the sweeper re-runs them on another node.
    """

    timeout_s: float
    remaining: Callable[[], int]
    poll_s: float = 0.5
    kill_grace_s: float = 10.0


DRAINED = 0
DRAIN_TIMED_OUT = 3
"""Exit code of a supervisor whose drain ran out of time (work was left for the sweeper)."""


class Supervisor:
    """Runs the stage workers of one node, restarts the ones that die, drains on SIGTERM.

    A Celery worker can die on its own (an unrecoverable broker error, an OOM kill, kill -9);
    its unacked messages are redelivered or recovered by the sweeper, and a fresh process takes
    its place after a backoff, so a node keeps serving every stage.

    SIGTERM with a `DrainPolicy` drains the node: the prepare workers get SIGTERM at once (Celery's
    warm shutdown: they stop taking messages from the pool-wide prepare queue and finish the
    prepares in flight), while run agent, build and evaluate keep consuming until no unfinished
    rollout is left on this node; then they get SIGTERM too. Nothing is restarted while draining.
    SIGINT, a second SIGTERM, or SIGTERM without a drain policy stop every worker at once (still
    a warm shutdown).
    """

    def __init__(
        self,
        workers: Sequence[StageWorker],
        env: Mapping[str, str] | None = None,
        poll_s: float = 0.2,
        drain: DrainPolicy | None = None,
        start: str = "forkserver",
    ) -> None:
        self.workers = list(workers)
        self.start = check_start_method(start)
        self.env = env
        self.poll_s = poll_s
        self.drain = drain
        self.state = "running"  # -> "draining" -> "stopping"
        self.procs: list[ChildProcess] = []
        self.terminated: set[int] = set()
        """Workers already sent SIGTERM: never sent it twice (a Python process that gets a second
        SIGTERM while it exits has its default handler back and dies by the signal)."""

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGTERM and self.drain is not None and self.state == "running":
            self.state = "draining"
            self._stop_taking()  # at once, not at the next poll: a prepare may be due any moment
        else:
            self.state = "stopping"

    def _takers(self) -> list[int]:
        """The workers that take new rollouts: prepare, from the pool-wide queue."""
        return [i for i, w in enumerate(self.workers) if w.stage is Stage.PREPARE]

    def _stop_taking(self) -> None:
        for i in self._takers():
            if i < len(self.procs):
                self._signal(i, signal.SIGTERM)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        if self.start == "forkserver":
            preload(STAGE_WORKER_IMPORTS, self.env)  # the fork server starts with their environment
        self.procs = [self._spawn(w) for w in self.workers]
        self._keep_up()
        code = DRAINED
        if self.state == "draining":
            code = self._drain()
        self._stop_all(
            STOP_WAIT_S if code == DRAINED or self.drain is None else self.drain.kill_grace_s
        )
        return code

    def _spawn(self, worker: StageWorker) -> ChildProcess:
        return spawn_one(worker, self.env, self.start)

    def _keep_up(self) -> None:
        """Restart workers that exit on their own, with backoff, until a signal arrives."""
        started = [time.monotonic()] * len(self.procs)
        failures = [0] * len(self.procs)
        due: list[float | None] = [None] * len(self.procs)
        while self.state == "running":
            now = time.monotonic()
            for i, proc in enumerate(self.procs):
                if due[i] is None and proc.poll() is not None:
                    if now - started[i] > HEALTHY_AFTER_S:
                        failures[i] = 0
                    delay = RESTART_BACKOFF_S[min(failures[i], len(RESTART_BACKOFF_S) - 1)]
                    failures[i] += 1
                    due[i] = now + delay
                    log.warning(
                        "%s exited with code %s; restarting in %.0f s",
                        self.workers[i].hostname, proc.returncode, delay,
                    )  # fmt: skip
                restart_at = due[i]
                if restart_at is not None and now >= restart_at:
                    self.procs[i] = self._spawn(self.workers[i])
                    self.terminated.discard(i)  # a new process: not signalled yet
                    started[i] = now
                    due[i] = None
            time.sleep(self.poll_s)

    def _drain(self) -> int:
        """Stop taking new rollouts, finish this node's own; DRAINED or DRAIN_TIMED_OUT."""
        assert self.drain is not None
        began = time.monotonic()
        deadline = began + self.drain.timeout_s
        takers = self._takers()
        self._stop_taking()  # again: a worker restarted meanwhile is told too
        log.warning(
            "draining: no new rollouts; finishing this node's own (timeout %.0f s)",
            self.drain.timeout_s,
        )
        remaining: int | None = None
        count_at = began
        while self.state == "draining":
            now = time.monotonic()
            if all(proc.poll() is not None for proc in self.procs):
                log.warning("draining: every worker has exited; %s rollouts left", remaining)
                return DRAINED if remaining == 0 else DRAIN_TIMED_OUT
            preparing = any(self.procs[i].poll() is None for i in takers)
            if not preparing and now >= count_at:  # the database is asked every drain.poll_s
                count_at = now + self.drain.poll_s
                remaining = self._remaining()
                if remaining == 0:
                    log.warning("drained in %.1f s", time.monotonic() - began)
                    return DRAINED
            if now >= deadline:
                log.warning(
                    "drain timeout (%.0f s): stopping with %s rollouts left on this node; "
                    "the sweeper re-runs them elsewhere once their leases expire",
                    self.drain.timeout_s, remaining,
                )  # fmt: skip
                return DRAIN_TIMED_OUT
            time.sleep(min(self.poll_s, self.drain.poll_s))
        return DRAIN_TIMED_OUT  # a second signal: stop now

    def _remaining(self) -> int | None:
        assert self.drain is not None
        try:
            return self.drain.remaining()
        except Exception as exc:  # the database may be briefly away: keep waiting
            log.warning("draining: cannot count this node's rollouts: %r", exc)
            return None

    def _signal(self, i: int, sig: int) -> None:
        if sig == signal.SIGTERM:
            if i in self.terminated:
                return
            self.terminated.add(i)
        if self.procs[i].poll() is None:
            self.procs[i].send_signal(sig)

    def _stop_all(self, wait_s: float) -> None:
        for i in range(len(self.procs)):
            self._signal(i, signal.SIGTERM)
        end = time.monotonic() + wait_s
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def supervise(
    workers: Sequence[StageWorker],
    env: Mapping[str, str] | None = None,
    poll_s: float = 0.2,
    drain: DrainPolicy | None = None,
    start: str = "forkserver",
) -> int:
    """Run the stage workers until a signal; see `Supervisor` (draining on SIGTERM)."""
    return Supervisor(workers, env, poll_s, drain, start).run()
