"""The sweeper: finds rollouts that nothing will move any more, and moves them.

Two kinds of stranded rollouts, both found from PostgreSQL alone (the broker is never trusted
to know what is pending):

- **Expired leases**: a busy rollout whose worker stopped renewing its lease (kill -9, lost node,
  frozen process). The build stage (database only) is resumed where it was; any other stage starts
  the rollout over from prepare with attempt+1, up to the job's `retries.max_attempts`, after
  which it fails with `worker_lost`.
- **Stranded on a dead node**: a rollout waiting in a node's own queue (prepared, built) whose
  node stopped stamping it (`waiting_leases`): started over from prepare, like an expired lease.
- **Held rollouts** of jobs under staleness control whose capacity grew without anyone admitting
  them (an API process that died between the version commit and the admission): admitted.
- **Lost messages**: a rollout waiting in a ready state (queued, prepared, ran, built) that has seen
  no event for `republish_after_s` while its queue is empty (the message was lost: a broker restart
  without persistence, a publish that failed after commit). Its message is sent again; a duplicate
  is harmless because stage claims are compare-and-set. The `republished` event it writes also
  rate-limits the next attempt.

Any number of sweepers may run: every change is a fenced UPDATE, so two sweepers never double one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.early_stop import after_rollout_ended
from polar_mq.lifecycle.messages import StageMessage, queue_name
from polar_mq.lifecycle.recovery import LostAttempt, Recovery, republish, restart, resume
from polar_mq.lifecycle.stages import BUSY, READY, Stage
from polar_mq.lifecycle.transitions import R
from polar_mq.models import Event, Job, TerminationReason
from polar_mq.models.base import utcnow
from polar_mq.observability.sweeper_metrics import observe_sweep
from polar_mq.policy.admission import admit_all
from polar_mq.policy.state import current_version
from polar_mq.spec import load_spec

log = logging.getLogger(__name__)

WAITING_ON_NODE: dict[str, Stage] = {
    ready: stage for ready, stage in READY.items() if stage.node_local
}
"""Ready states whose next stage runs on the rollout's node (`waiting_leases`)."""

QueueDepth = Callable[[str], int | None]
"""Messages waiting in a queue, or None when the broker cannot say (then nothing is re-sent)."""


@dataclass
class SweepReport:
    requeued: int = 0
    resumed: int = 0
    failed: int = 0
    republished: int = 0
    raced: int = 0
    admitted: int = 0
    """Groups of staleness-controlled jobs admitted (normally done by the API; a safety net)."""
    details: list[dict[str, Any]] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return self.requeued + self.resumed + self.failed + self.republished


class Sweeper:
    def __init__(
        self,
        settings: Settings,
        factory: sessionmaker[Session],
        queue_depth: QueueDepth,
        name: str = "sweeper",
        batch: int = 500,
    ) -> None:
        self.settings = settings
        self.factory = factory
        self.queue_depth = queue_depth
        self.name = name
        self.batch = batch

    def sweep_once(self, now: datetime | None = None) -> SweepReport:
        now = now or utcnow()
        report = SweepReport()
        with unit_of_work(self.factory) as session:
            ended = self._expired_leases(session, now, report)
            ended += self._stranded(session, now, report)
        self._early_stops(ended)
        with unit_of_work(self.factory) as session:
            self._lost_messages(session, now, report)
        with unit_of_work(self.factory) as session:
            report.admitted = admit_all(session, current_version(session), worker=self.name)
        if report.changed:
            log.warning("sweeper: %s", report.details)
        observe_sweep(report)
        return report

    def _expired_leases(self, session: Session, now: datetime, report: SweepReport) -> list[Any]:
        """Restart or resume what lost its worker; the rows of the rollouts it gave up (failed)."""
        ended = []
        rows = session.execute(
            select(R.id, R.job_id, R.task_index, R.status, R.attempt, R.lease_owner, Job.spec)
            .join(Job, Job.id == R.job_id)
            .where(R.status.in_(list(BUSY)), R.lease_expires_at < now)
            .limit(self.batch)
        ).all()
        for row in rows:
            lost = _lost_attempt(row, row.lease_owner)
            stage = BUSY[row.status]
            if stage is Stage.BUILD:
                outcome = resume(session, lost, stage, self.name)
            else:
                outcome = restart(
                    session, lost, TerminationReason.WORKER_LOST,
                    f"lease of {row.lease_owner} expired during {stage}", self.name, stage.value,
                )  # fmt: skip
            _count(report, outcome, rollout=str(row.id), stage=stage.value, owner=row.lease_owner)
            if outcome is Recovery.FAILED:
                ended.append(row)
        return ended

    def _stranded(self, session: Session, now: datetime, report: SweepReport) -> list[Any]:
        """Restart what waits in the queue of a node that stopped consuming it: its
        lease (given by the stage that left it waiting, renewed by the node's `waiting_leases`)
        expired: a dead node. No lease at all (NULL, rows from before leases): left alone."""
        rows = session.execute(
            select(R.id, R.job_id, R.task_index, R.status, R.attempt, R.node, Job.spec)
            .join(Job, Job.id == R.job_id)
            .where(
                R.status.in_(list(WAITING_ON_NODE)),
                R.lease_owner.is_(None),
                R.lease_expires_at < now,
            )
            .limit(self.batch)
        ).all()
        ended = []
        for row in rows:
            lost = _lost_attempt(row, None)
            stage = WAITING_ON_NODE[row.status]
            outcome = restart(
                session, lost, TerminationReason.WORKER_LOST,
                f"node {row.node} stopped serving its {stage} queue", self.name, stage.value,
            )  # fmt: skip
            _count(report, outcome, rollout=str(row.id), stage=stage.value, node=row.node)
            if outcome is Recovery.FAILED:
                ended.append(row)
        return ended

    def _early_stops(self, ended: list[Any]) -> None:
        """The early-stop check of each rollout given up on, after that was committed."""
        for row in ended:
            spec = load_spec(row.spec)
            if spec.stop is None:
                continue
            try:
                with unit_of_work(self.factory) as session:
                    after_rollout_ended(session, row.job_id, row.task_index, spec, self.name)
            except Exception:
                log.exception("early-stop check after rollout %s failed", row.id)

    def _lost_messages(self, session: Session, now: datetime, report: SweepReport) -> None:
        last_event = select(func.max(Event.at)).where(Event.rollout_id == R.id).scalar_subquery()
        cutoff = now - timedelta(seconds=self.settings.republish_after_s)
        rows = session.execute(
            select(R.id, R.job_id, R.task_index, R.status, R.attempt, R.node, Job.spec)
            .join(Job, Job.id == R.job_id)
            .where(R.status.in_(list(READY)), func.coalesce(last_event, R.created_at) < cutoff)
            .limit(self.batch)
        ).all()
        depths: dict[str, int | None] = {}
        for row in rows:
            stage, spec = READY[row.status], load_spec(row.spec)
            message = StageMessage(
                stage, row.id, spec.pool, row.node, row.attempt, priority=spec.priority
            )
            try:
                queue = queue_name(self.settings.queue_prefix, stage, message.pool, row.node)
            except ValueError:  # a node-local stage without a node: only a restart can help
                continue
            if queue not in depths:
                depths[queue] = self.queue_depth(queue)
            if depths[queue] != 0:
                continue  # unknown, or messages are waiting: ours may well be among them
            republish(session, message, row.job_id, self.name, now, queue)
            report.republished += 1
            report.details.append({"republished": str(row.id), "stage": stage.value})

    def run_forever(self, stop: threading.Event) -> None:
        """Sweep every `sweep_interval_s` until `stop` is set; a failed sweep is only logged."""
        while not stop.is_set():
            try:
                self.sweep_once()
            except Exception:
                log.exception("sweep failed; next one in %.1f s", self.settings.sweep_interval_s)
            stop.wait(self.settings.sweep_interval_s)


def _lost_attempt(row: Any, owner: str | None) -> LostAttempt:
    """The attempt a swept row stands for, with the recovery settings of its job's spec; the row
    carries the job's spec and task index, which the early-stop check after a give-up reads."""
    spec = load_spec(row.spec)
    return LostAttempt(
        row.id, row.job_id, row.status, row.attempt, owner,
        spec.pool, spec.retries.max_attempts, spec.priority,
    )  # fmt: skip


def _count(report: SweepReport, outcome: Recovery, **detail: Any) -> None:
    if outcome is Recovery.REQUEUED:
        report.requeued += 1
    elif outcome is Recovery.RESUMED:
        report.resumed += 1
    elif outcome is Recovery.FAILED:
        report.failed += 1
    else:
        report.raced += 1
    report.details.append({"outcome": outcome, **detail})


def build_sweeper(settings: Settings) -> Sweeper:
    """A sweeper wired to the database and the broker of `settings` (the CLI's and tests' way)."""
    from polar_mq.dispatch.celery_app import create_celery, publish_messages, queue_depth
    from polar_mq.infra.db import create_db_engine, make_session_factory
    from polar_mq.lifecycle.outbox import attach_publisher

    app = create_celery(settings)
    factory = make_session_factory(create_db_engine(settings.database_url))
    attach_publisher(factory, lambda messages: publish_messages(app, messages))
    return Sweeper(settings, factory, lambda queue: queue_depth(app, queue))
