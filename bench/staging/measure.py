"""The three ways of running the same rollouts, and what each run measured.

Every rollout does the same work: a prepare recipe of `prepare_s` seconds (`sleep`), an agent of
three chat calls through the real proxy to the vLLM-shaped fake upstream, which waits
`agent_s / 3` before answering each, and a `command` evaluator of `evaluate_s` seconds run
inside the runtime. Agent-slot busy time is read from the run-agent stage's started/finished
events (claim to commit: the time a slot is held), wall time from the first submit to the moment
the last rollout is terminal.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, select

from bench.pipeline.measure import AGENT_CALLS, trivial_agent_harness
from polar_mq.config import Settings
from polar_mq.dispatch.submit import enqueue_job
from polar_mq.models import Event, EventKind, Rollout, RolloutStatus

POLL_S = 0.05


@dataclass(frozen=True)
class Workload:
    slots: int
    prepare_s: float
    agent_s: float
    evaluate_s: float

    def spec(self, n_tasks: int, samples: int, warm: bool, label: str) -> dict[str, Any]:
        runtime: dict[str, Any] = {
            "kind": "local",
            "prepare": {
                "files": {"fixture.txt": "prepared"},
                "commands": [f"sleep {self.prepare_s}"],
            },
        }
        if warm:
            runtime.update(warm=True, reuse=True)
        return {
            "tasks": [{"instruction": f"{label} task {i}"} for i in range(n_tasks)],
            "samples_per_task": samples,
            "harness": trivial_agent_harness(),
            "runtime": runtime,
            "evaluator": {"name": "command", "command": f"sleep {self.evaluate_s}"},
            "builder": "per_call",
            "timeouts": {"agent_s": 120 + 4 * self.agent_s},
            "metadata": {"bench": "staging", "label": label},
        }


@dataclass
class Run:
    """One measured configuration."""

    name: str
    n: int
    slots: int
    wall_s: float
    agent_busy_s: float
    agent_window_s: float
    stage_s: dict[str, float] = field(default_factory=dict)
    runtime_sources: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def per_minute(self) -> float:
        return 60.0 * self.n / self.wall_s

    @property
    def utilisation(self) -> float:
        """Agent-slot busy share of the whole run (first submit to last rollout terminal)."""
        return self.agent_busy_s / (self.slots * self.wall_s)

    @property
    def utilisation_window(self) -> float:
        """Busy share between the first agent start and the last agent end (no fill/drain)."""
        return self.agent_busy_s / (self.slots * self.agent_window_s)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "n": self.n,
            "slots": self.slots,
            "wall_s": round(self.wall_s, 3),
            "rollouts_per_min": round(self.per_minute, 2),
            "agent_busy_s": round(self.agent_busy_s, 3),
            "utilisation": round(self.utilisation, 4),
            "utilisation_agent_window": round(self.utilisation_window, 4),
            "stage_median_s": {k: round(v, 4) for k, v in self.stage_s.items()},
            "runtime_sources": self.runtime_sources,
            "statuses": self.statuses,
            "warnings": self.warnings,
        }


def _terminal(engine: Engine, job_ids: list[uuid.UUID]) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count())
                .select_from(Rollout)
                .where(Rollout.job_id.in_(job_ids), Rollout.status.in_(RolloutStatus.TERMINAL))
            ).scalar_one()
        )


def _wait(engine: Engine, job_ids: list[uuid.UUID], n: int, deadline: float) -> bool:
    while _terminal(engine, job_ids) < n:
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def _analyse(
    engine: Engine, name: str, job_ids: list[uuid.UUID], n: int, slots: int, wall_s: float
) -> Run:
    with engine.connect() as conn:
        events = conn.execute(
            select(Event.rollout_id, Event.stage, Event.kind, Event.at, Event.detail).where(
                Event.job_id.in_(job_ids),
                Event.kind.in_((EventKind.STARTED, EventKind.FINISHED)),
            )
        ).all()
        statuses = conn.execute(
            select(Rollout.status, Rollout.termination_reason, func.count())
            .where(Rollout.job_id.in_(job_ids))
            .group_by(Rollout.status, Rollout.termination_reason)
        ).all()
    starts: dict[tuple[Any, str], datetime] = {}
    durations: dict[str, list[float]] = {}
    sources: dict[str, int] = {}
    intervals: list[tuple[datetime, datetime]] = []
    for rollout_id, stage, kind, at, detail in sorted(events, key=lambda e: e.at):
        if kind == EventKind.STARTED:
            starts[(rollout_id, stage)] = at
            continue
        if isinstance(detail, Mapping) and "duration_s" in detail:
            durations.setdefault(stage, []).append(float(detail["duration_s"]))
        if stage == "prepare" and isinstance(detail, Mapping):
            source = (detail.get("runtime") or {}).get("source", "?")
            sources[source] = sources.get(source, 0) + 1
        if stage == "run_agent" and (rollout_id, stage) in starts:
            intervals.append((starts[(rollout_id, stage)], at))
    busy = sum((end - start).total_seconds() for start, end in intervals)
    window = (
        (max(e for _, e in intervals) - min(s for s, _ in intervals)).total_seconds()
        if intervals
        else float("nan")
    )
    run = Run(
        name, n, slots, wall_s, busy, window,
        {stage: statistics.median(v) for stage, v in durations.items()}, sources,
        {f"{s}/{r}": int(c) for s, r, c in statuses},
    )  # fmt: skip
    done = run.statuses.get("completed/completed", 0)
    if done != n:
        run.warnings.append(f"{name}: {done}/{n} rollouts completed: {run.statuses}")
    if len(intervals) != n:
        run.warnings.append(f"{name}: {len(intervals)}/{n} agent runs found in the events")
    return run


def sequential(settings: Settings, engine: Engine, work: Workload, n: int, timeout_s: float) -> Run:
    """(a): each agent slot runs its rollouts one after the other, every stage in turn.

    `slots` client lanes; each submits a one-rollout job and waits for it to be terminal before
    submitting the next, so a slot holds its rollout through prepare, agent and evaluate.
    """
    per_lane = -(-n // work.slots)
    job_ids: list[uuid.UUID] = []
    lock = threading.Lock()
    errors: list[str] = []
    deadline = time.monotonic() + timeout_s

    def lane(index: int) -> None:
        for i in range(per_lane):
            if index * per_lane + i >= n:
                return
            job = enqueue_job(settings, work.spec(1, 1, False, f"seq-{index}-{i}"))
            with lock:
                job_ids.append(job.job_id)
            if not _wait(engine, [job.job_id], 1, deadline):
                errors.append(f"lane {index}: timed out")
                return

    started = time.perf_counter()
    lanes = [threading.Thread(target=lane, args=(i,)) for i in range(work.slots)]
    for thread in lanes:
        thread.start()
    for thread in lanes:
        thread.join()
    wall = time.perf_counter() - started
    run = _analyse(engine, "(a) sequential per slot", job_ids, n, work.slots, wall)
    run.warnings += errors
    return run


def staged(
    settings: Settings,
    engine: Engine,
    work: Workload,
    n: int,
    warm: bool,
    timeout_s: float,
    name: str,
) -> Run:
    """(b)/(c): one job of `n` rollouts; the stage workers pipeline them."""
    spec = work.spec(n // 4, 4, warm, name)
    started = time.perf_counter()
    job = enqueue_job(settings, spec)
    ok = _wait(engine, [job.job_id], n, time.monotonic() + timeout_s)
    wall = time.perf_counter() - started
    run = _analyse(engine, name, [job.job_id], n, work.slots, wall)
    if not ok:
        run.warnings.append(f"{name}: timed out after {timeout_s:.0f}s")
    return run


__all__ = ["AGENT_CALLS", "Run", "Workload", "sequential", "staged"]
