"""Read services behind the rollout endpoints: detail with events and stage timings, trajectory,
captured LLM calls."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from polar_mq.calls.window import calls_window
from polar_mq.infra.errors import NotFound
from polar_mq.jobs.read_models import (
    EvaluationRecord,
    EventRecord,
    LlmCallRecord,
    RolloutCalls,
    RolloutDetail,
    RolloutTrajectory,
    StageTiming,
    TrajectorySampleRecord,
    record,
)
from polar_mq.lifecycle.stages import STAGE_OF_STATUS
from polar_mq.models import (
    Evaluation,
    Event,
    EventKind,
    LlmCall,
    Rollout,
    TrajectorySample,
)


def _get_rollout(session: Session, rollout_id: uuid.UUID) -> Rollout:
    rollout = session.get(Rollout, rollout_id)
    if rollout is None:
        raise NotFound("rollout", rollout_id)
    return rollout


def stage_timings(events: Sequence[EventRecord], attempt: int) -> dict[str, StageTiming]:
    """Start, end and duration of each stage of one attempt, from its started/finished events."""
    timings: dict[str, StageTiming] = {}
    for ev in events:
        if ev.attempt != attempt:
            continue
        if ev.kind == EventKind.STARTED:
            timings[ev.stage] = StageTiming(ev.at, None, None, "running")
        elif ev.kind in (EventKind.FINISHED, EventKind.FAILED):
            started = timings.get(ev.stage)
            started_at = started.started_at if started else None
            duration = ev.detail.get("duration_s") if ev.kind == EventKind.FINISHED else None
            if not isinstance(duration, int | float) and started_at is not None:
                duration = round((ev.at - started_at).total_seconds(), 4)
            outcome = "finished" if ev.kind == EventKind.FINISHED else "failed"
            timings[ev.stage] = StageTiming(started_at, ev.at, duration, outcome)
        elif ev.kind == EventKind.CANCELLED:  # a stage cancelled while running ends here
            for stage, timing in timings.items():
                if timing.outcome == "running" and timing.started_at is not None:
                    took = round(max(0.0, (ev.at - timing.started_at).total_seconds()), 4)
                    timings[stage] = StageTiming(timing.started_at, ev.at, took, "cancelled")
    return timings


def runtime_timings(events: Sequence[EventRecord], attempt: int) -> dict[str, Any]:
    """How the attempt's runtime was obtained (prepare's `finished` detail) and released."""
    summary: dict[str, Any] = {}
    for ev in events:
        if ev.attempt != attempt:
            continue
        if ev.kind == EventKind.FINISHED and ev.stage == "prepare":
            summary.update(ev.detail.get("runtime") or {})
        elif ev.kind == EventKind.RUNTIME_RELEASED:
            summary.update({k: v for k, v in ev.detail.items() if k != "runtime_id"})
    return summary


def rollout_detail(session: Session, rollout_id: uuid.UUID) -> RolloutDetail:
    """A rollout's fields, its event log, stage timings and the evaluator's verdict."""
    r = _get_rollout(session, rollout_id)
    events = [
        record(EventRecord, e, detail=e.detail or {})
        for e in session.scalars(
            select(Event).where(Event.rollout_id == rollout_id).order_by(Event.id)
        )
    ]
    evaluation = session.scalar(
        select(Evaluation).where(
            Evaluation.rollout_id == rollout_id, Evaluation.attempt == r.attempt
        )
    )
    return record(
        RolloutDetail,
        r,
        rollout_id=r.id,
        stage=STAGE_OF_STATUS.get(r.status, (None, None))[0],
        timings=stage_timings(events, r.attempt),
        runtime=runtime_timings(events, r.attempt),
        evaluation=None if evaluation is None else record(EvaluationRecord, evaluation),
        events=events,
    )


def rollout_trajectory(session: Session, rollout_id: uuid.UUID) -> RolloutTrajectory:
    """The training samples of the rollout's current attempt (earlier attempts are superseded)."""
    r = _get_rollout(session, rollout_id)
    samples = session.scalars(
        select(TrajectorySample)
        .where(TrajectorySample.rollout_id == rollout_id, TrajectorySample.attempt == r.attempt)
        .order_by(TrajectorySample.sample_index)
    )
    return RolloutTrajectory(
        rollout_id=r.id,
        attempt=r.attempt,
        status=r.status,
        reward=r.reward,
        samples=[record(TrajectorySampleRecord, s, meta=s.meta or {}) for s in samples],
    )


def rollout_calls(session: Session, rollout_id: uuid.UUID) -> RolloutCalls:
    """Every LLM call the proxy captured for the rollout, attempt by attempt in call order, token
    ids included."""
    r = _get_rollout(session, rollout_id)
    calls = session.scalars(
        select(LlmCall)
        .where(LlmCall.rollout_id == rollout_id, *calls_window(r.created_at, r.finished_at))
        .order_by(LlmCall.attempt, LlmCall.seq, LlmCall.created_at)  # seq counts per attempt
    )
    return RolloutCalls(
        rollout_id=rollout_id,
        calls=[record(LlmCallRecord, c) for c in calls],
    )
