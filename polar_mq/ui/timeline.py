"""A rollout's stage timeline, read from its append-only event log.

The REST detail gives per-stage start and end of the current attempt (`stage_timings`); a person
debugging a stuck rollout also wants when each stage became *ready* (the queue wait: a stage is
queued when the previous one finished, when the job submitted or admitted the rollout, or when the
sweeper requeued it), how many times a stage was started (in-place retries, leases lost and
resumed) and every attempt, not only the last one. All of it follows from the events alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from polar_mq.jobs.read_models import EventRecord
from polar_mq.lifecycle.stages import NEXT_STAGE, Stage
from polar_mq.models import EventKind

STAGE_ORDER = {stage.value: i for i, stage in enumerate(Stage)}


@dataclass(slots=True)
class StageSpan:
    """One stage of one attempt."""

    attempt: int
    stage: str
    queued_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    outcome: str = "waiting"
    """waiting | queued | running | finished | failed | cancelled | retried (its attempt was
    given up and the rollout started over)"""
    starts: int = 0
    """How many times a worker claimed it (more than 1: retried or resumed after a lost lease)."""
    worker: str | None = None

    @property
    def wait_s(self) -> float | None:
        if self.queued_at is None or self.started_at is None:
            return None
        return max(0.0, (self.started_at - self.queued_at).total_seconds())

    @property
    def run_s(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return max(0.0, (self.ended_at - self.started_at).total_seconds())


@dataclass(frozen=True, slots=True)
class Bar:
    """A span drawn on the timeline chart, in pixels from the chart's left edge."""

    span: StageSpan
    row: int
    wait_x: float
    wait_w: float
    run_x: float
    run_w: float


@dataclass(frozen=True, slots=True)
class Timeline:
    spans: list[StageSpan]
    bars: list[Bar]
    width: int
    total_s: float
    leases_lost: int
    """Requeues by the sweeper or a worker (a new attempt, or the same stage resumed)."""


def _span(spans: dict[tuple[int, str], StageSpan], attempt: int, stage: str) -> StageSpan:
    key = (attempt, stage)
    if key not in spans:
        spans[key] = StageSpan(attempt, stage)
    return spans[key]


def _queue(spans: dict[tuple[int, str], StageSpan], attempt: int, stage: str, at: datetime) -> None:
    span = _span(spans, attempt, stage)
    if span.queued_at is None:
        span.queued_at = at
    if span.outcome == "waiting":
        span.outcome = "queued"


def _close(
    spans: dict[tuple[int, str], StageSpan],
    at: datetime,
    outcome: str,
    before_attempt: int | None = None,
) -> None:
    """End every span still queued or running (of attempts before `before_attempt`, if given):
    the rollout was cancelled, or that attempt was given up for a new one."""
    for span in spans.values():
        if span.outcome not in ("queued", "running"):
            continue
        if before_attempt is not None and span.attempt >= before_attempt:
            continue
        span.ended_at = at
        span.outcome = outcome


def stage_spans(events: Sequence[EventRecord]) -> tuple[list[StageSpan], int]:
    """Every (attempt, stage) the events mention, in attempt then stage order; and lost leases."""
    spans: dict[tuple[int, str], StageSpan] = {}
    lost = 0
    for ev in events:
        if ev.kind == EventKind.CANCELLED:  # its stage is "cancel": whatever was open ends here
            _close(spans, ev.at, "cancelled")
            continue
        if ev.stage not in STAGE_ORDER:
            continue  # job-level events (e.g. stopped) and anything newer than this view
        if ev.kind in (EventKind.SUBMITTED, EventKind.ADMITTED, EventKind.RETRIED):
            _queue(spans, ev.attempt, ev.stage, ev.at)
        elif ev.kind == EventKind.REQUEUED:
            lost += 1
            resumed = bool(ev.detail.get("resumed"))
            if not resumed:  # a new attempt: the old one's running stage never gets an end
                _close(spans, ev.at, "retried", before_attempt=ev.attempt)
            _queue(spans, ev.attempt, ev.stage if resumed else Stage.PREPARE.value, ev.at)
        elif ev.kind == EventKind.STARTED:
            span = _span(spans, ev.attempt, ev.stage)
            span.starts += 1
            span.started_at = span.started_at or ev.at
            span.worker = ev.worker
            span.outcome = "running"
        elif ev.kind in (EventKind.FINISHED, EventKind.FAILED, EventKind.CANCELLED):
            span = _span(spans, ev.attempt, ev.stage)
            span.ended_at = ev.at
            span.outcome = {EventKind.FINISHED: "finished", EventKind.FAILED: "failed"}.get(
                ev.kind, "cancelled"
            )
            following = NEXT_STAGE[Stage(ev.stage)]
            if ev.kind == EventKind.FINISHED and following is not None:
                _queue(spans, ev.attempt, following.value, ev.at)
    ordered = sorted(spans.values(), key=lambda s: (s.attempt, STAGE_ORDER[s.stage]))
    return ordered, lost


def timeline(events: Sequence[EventRecord], now: datetime, width: int = 640) -> Timeline:
    """The spans and their bars on a chart `width` pixels wide (running spans end at `now`)."""
    spans, lost = stage_spans(events)
    moments = [t for s in spans for t in (s.queued_at, s.started_at, s.ended_at) if t is not None]
    if not moments:
        return Timeline(spans, [], width, 0.0, lost)
    start = min(moments)
    end = max(
        [*moments, now] if any(s.outcome in ("queued", "running") for s in spans) else moments
    )
    total = max((end - start).total_seconds(), 1e-3)
    scale = width / total

    def x(at: datetime | None) -> float:
        return 0.0 if at is None else (at - start).total_seconds() * scale

    bars = []
    for row, span in enumerate(spans):
        queued = x(span.queued_at if span.queued_at is not None else span.started_at)
        started = x(span.started_at) if span.started_at is not None else x(end)
        ended = x(span.ended_at) if span.ended_at is not None else x(end)
        run_w = max(ended - started, 2.0) if span.started_at is not None else 0.0
        bars.append(Bar(span, row, queued, max(started - queued, 0.0), started, run_w))
    return Timeline(spans, bars, width, total, lost)
