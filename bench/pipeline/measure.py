"""The three measurements: raw Celery chains, the no-op pipeline, the trivial-agent pipeline.

Each measurement is timed from just before its first submit to the moment completion is seen
(the Redis counter for chains, the rollouts table for polar_mq), with the CPU of the processes
under test sampled at the same two instants.
"""

from __future__ import annotations

import shlex
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from sqlalchemy import Engine, func, select

from bench.pipeline import baseline, cpu
from bench.pipeline import floor as floor_steps
from polar_mq.config import Settings
from polar_mq.dispatch.submit import enqueue_job
from polar_mq.models import Event, EventKind, LlmCall, Rollout, RolloutStatus

POLL_S = 0.02
AGENT_CALLS = 3
TRIVIAL_AGENT = Path(__file__).with_name("trivial_agent.py")

NOOP_HARNESS: dict[str, Any] = {"type": "command", "command": "true"}


def trivial_agent_harness() -> dict[str, Any]:
    # -I -S: isolated, no site-packages scan; the agent needs only the standard library.
    command = f"{shlex.quote(sys.executable)} -I -S {shlex.quote(str(TRIVIAL_AGENT))}"
    return {"type": "command", "command": command}


SPAWNED = "agent processes (reaped by the workers)"
POSTGRES = "postgres backends (bench db, approx.)"
REDIS = "redis-server (whole server)"
"""The names of the process groups a `Timer` samples beside its workers (the report reads them)."""


@dataclass
class Measurement:
    """One timed run: throughput, CPU by process group, and what the checks found."""

    kind: str
    n: int
    elapsed_s: float
    submit_wall_s: float
    submit_cpu_s: float
    cpu_s: dict[str, float]
    machine_busy_s: float
    warnings: list[str] = field(default_factory=list)
    stage_ms: dict[str, float] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    threads_s: dict[str, tuple[float, float]] = field(default_factory=dict)
    """(main thread, other threads) CPU seconds per tracked process tree (`cpu.thread_split`)."""

    @property
    def rate(self) -> float:
        return self.n / self.elapsed_s

    def cpu_ms_per_item(self, names: list[str] | None = None) -> float:
        total = sum(v for k, v in self.cpu_s.items() if names is None or k in names)
        return 1000.0 * total / self.n

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "n": self.n,
            "elapsed_s": round(self.elapsed_s, 4),
            "per_s": round(self.rate, 2),
            "submit_wall_s": round(self.submit_wall_s, 4),
            "submit_cpu_s": round(self.submit_cpu_s, 4),
            "cpu_s": {k: round(v, 4) for k, v in self.cpu_s.items()},
            "machine_busy_s": round(self.machine_busy_s, 3),
            "stage_ms_median": {k: round(v, 3) for k, v in self.stage_ms.items()},
            "statuses": self.statuses,
            "threads_s": {k: [round(v, 4) for v in pair] for k, pair in self.threads_s.items()},
            "warnings": self.warnings,
        }


class Timer:
    """CPU snapshots of the tracked processes and the machine around a timed section."""

    def __init__(
        self,
        pids: Mapping[str, int],
        extra: Mapping[str, Callable[[], dict[int, float]]],
    ) -> None:
        self.pids = pids
        self.extra = extra

    def start(self) -> tuple[float, float, cpu.CpuSnapshot]:
        snap = cpu.snapshot(self.pids, self.extra)
        return time.perf_counter(), cpu.machine_busy_s(), snap

    def stop(
        self, started: tuple[float, float, cpu.CpuSnapshot]
    ) -> tuple[float, float, cpu.CpuDelta]:
        elapsed = time.perf_counter() - started[0]
        busy = cpu.machine_busy_s() - started[1]
        change = cpu.delta(started[2], cpu.snapshot(self.pids, self.extra))
        # only the tracked trees matter; scanned groups (PostgreSQL backends) come and go
        change.lost = {k: v for k, v in change.lost.items() if k in self.pids}
        return elapsed, busy, change


def _lost_warnings(delta: cpu.CpuDelta) -> list[str]:
    return [
        f"CPU of {name} descendants {pids} vanished during the window (not counted)"
        for name, pids in delta.lost.items()
    ]


# -- (1) the raw Celery chain -----------------------------------------------------------------


def run_chains(
    app: Celery,
    client: redis.Redis,
    prefix: str,
    n: int,
    timer: Timer,
    timeout_s: float,
    floor: FloorRun | None = None,
) -> Measurement:
    """`n` chains; with `floor`, of that floor's mode, over items seeded before the timing."""
    key = f"{prefix}.counter.{uuid.uuid4().hex[:8]}"
    client.delete(key)
    items = floor.seed(n) if floor is not None else []
    mode = floor.mode if floor is not None else None
    started = timer.start()
    cpu0 = time.thread_time()
    baseline.submit_chains(app, prefix, key, n, mode, items)
    submit_cpu = time.thread_time() - cpu0
    submit_wall = time.perf_counter() - started[0]
    deadline = time.monotonic() + timeout_s
    done = 0
    while True:
        done = int(client.get(key) or 0)
        if done >= n or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    elapsed, busy, delta = timer.stop(started)
    client.delete(key)
    warnings = _lost_warnings(delta)
    kind = mode or "baseline"
    if done < n:
        warnings.append(f"{kind}: only {done}/{n} chains finished within {timeout_s:.0f}s")
    if floor is not None:
        behind, odd = floor.check(items)
        if behind or odd:
            warnings.append(
                f"{kind}: {behind} items not at the last stage, {odd} without 2 events per step"
            )
    return Measurement(
        kind, n, elapsed, submit_wall, submit_cpu, delta.seconds, busy, warnings,
        statuses={"finished": done}, threads_s=delta.threads,
    )  # fmt: skip


@dataclass
class FloorRun:
    """A floor mode's chains (`bench.pipeline.floor`): their items, seeded in `engine`, and the
    check that each went through every step once."""

    mode: str
    engine: Engine

    def seed(self, n: int) -> list[int]:
        return floor_steps.seed(self.engine, n)

    def check(self, items: list[int]) -> tuple[int, int]:
        return floor_steps.unfinished(self.engine, items)


# -- (2) and (3) polar_mq's pipeline ----------------------------------------------------------


def job_spec(n: int, harness: Mapping[str, Any], label: str, group: int) -> dict[str, Any]:
    """`n` rollouts as ceil(n/group) tasks x group samples (n is a multiple of group)."""
    return {
        "tasks": [{"instruction": f"{label} task {i}"} for i in range(n // group)],
        "samples_per_task": group,
        "harness": dict(harness),
        "evaluator": "completed",
        "builder": "per_call",
        "timeouts": {"agent_s": 60},
        "metadata": {"bench": "pipeline", "label": label},
    }


def _terminal_count(engine: Engine, job_id: uuid.UUID) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count())
                .select_from(Rollout)
                .where(Rollout.job_id == job_id, Rollout.status.in_(RolloutStatus.TERMINAL))
            ).scalar_one()
        )


AGENT_OWN = "  of which the agent's own run (agent_s)"
"""The in-stage key of the agent's own run time; run_agent minus this is what the stage adds."""
AGENT_PHASES = ("setup_s", "reap_s", "flush_s", "collect_s")
"""The run-agent stage's own phases (its `finished` event), shown under the agent's run."""


def _check_job(
    engine: Engine, job_id: uuid.UUID, n: int, expect_calls: int | None
) -> tuple[dict[str, int], dict[str, float], list[str]]:
    """Statuses, median in-stage durations (ms) and warnings for a finished job."""
    warnings: list[str] = []
    with engine.connect() as conn:
        rows = conn.execute(
            select(Rollout.status, Rollout.termination_reason, func.count())
            .where(Rollout.job_id == job_id)
            .group_by(Rollout.status, Rollout.termination_reason)
        ).all()
        statuses: Counter[str] = Counter()
        for status, reason, count in rows:
            statuses[f"{status}/{reason}"] += int(count)
        if statuses.get(f"{RolloutStatus.COMPLETED}/completed", 0) != n:
            warnings.append(f"not every rollout ended completed: {dict(statuses)}")
            errors = conn.execute(
                select(Rollout.error).where(Rollout.job_id == job_id, Rollout.error.is_not(None))
            ).first()
            if errors is not None:
                warnings.append(f"e.g. error: {str(errors[0])[-300:]}")
        if expect_calls is not None:
            per_rollout = conn.execute(
                select(Rollout.id, func.count(LlmCall.id))
                .outerjoin(LlmCall, LlmCall.rollout_id == Rollout.id)
                .where(Rollout.job_id == job_id)
                .group_by(Rollout.id)
            ).all()
            histogram = dict(Counter(int(count) for _, count in per_rollout))
            if histogram != {expect_calls: n}:
                warnings.append(
                    f"expected {expect_calls} LLM calls stored per rollout, found "
                    f"{{calls: rollouts}} = {histogram}"
                )
        durations: dict[str, list[float]] = {}
        for stage, detail in conn.execute(
            select(Event.stage, Event.detail).where(
                Event.job_id == job_id, Event.kind == EventKind.FINISHED
            )
        ):
            if isinstance(detail, dict) and "duration_s" in detail:
                durations.setdefault(str(stage), []).append(1000.0 * float(detail["duration_s"]))
                if "agent_s" in detail:  # the agent's own run time, inside run_agent's
                    durations.setdefault(AGENT_OWN, []).append(1000.0 * float(detail["agent_s"]))
                for key in AGENT_PHASES:
                    if key in detail:
                        durations.setdefault(f"    {key}", []).append(1000.0 * float(detail[key]))
    stage_ms = {stage: statistics.median(values) for stage, values in durations.items()}
    return dict(statuses), stage_ms, warnings


def run_pipeline(
    settings: Settings,
    engine: Engine,
    kind: str,
    n: int,
    harness: Mapping[str, Any],
    group: int,
    timer: Timer,
    timeout_s: float,
    expect_calls: int | None = None,
) -> Measurement:
    spec = job_spec(n, harness, kind, group)
    started = timer.start()
    cpu0 = time.thread_time()
    job = enqueue_job(settings, spec)
    submit_cpu = time.thread_time() - cpu0
    submit_wall = time.perf_counter() - started[0]
    deadline = time.monotonic() + timeout_s
    done = 0
    while True:
        done = _terminal_count(engine, job.job_id)
        if done >= n or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    elapsed, busy, delta = timer.stop(started)
    warnings = _lost_warnings(delta)
    if done < n:
        warnings.append(f"{kind}: only {done}/{n} rollouts terminal within {timeout_s:.0f}s")
    statuses, stage_ms, check_warnings = _check_job(engine, job.job_id, n, expect_calls)
    return Measurement(
        kind, n, elapsed, submit_wall, submit_cpu, delta.seconds, busy,
        warnings + [f"{kind}: {w}" for w in check_warnings], stage_ms, statuses, delta.threads,
    )  # fmt: skip
