"""Streaming complete groups to trainers: leases, acknowledgements, redelivery.

A trainer (a *consumer*, named by a string it chooses) leases complete groups in completion order;
each hand-out is a *delivery* with its own id and a lease. An acknowledged group is never handed
out again; a group whose lease expires unacknowledged (the trainer died, or was too slow) is handed
out again to whoever leases next, with `delivery_count` + 1. That is at-least-once delivery with
exactly-once acknowledgement: a group can be *received* twice across a crash, but only one
delivery of it can ever be acked, so a trainer that trains on what it acks never double-counts.

The claim is one statement, `INSERT ... ON CONFLICT (job_id, task_index) DO UPDATE ... WHERE the
lease expired and nobody acked`: two consumers racing for a group serialise on its row (PostgreSQL
makes the second wait for the first's commit and then re-checks the WHERE on the new row version),
so exactly one of them gets it, with no advisory lock and no SELECT FOR UPDATE round trip. The same
statement runs on the embedded SQLite default, where writers are serialised anyway.

No settle delay is needed here (unlike the cursor of `results.py`): a delivery is about set
membership, not a position, so a group whose completion commits late is simply picked up by the
next lease. Lease times use this process's clock, as the rollout leases of the workers do.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, func, or_, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from polar_mq.infra.errors import PolarError
from polar_mq.jobs.queries import get_job, rollout_totals
from polar_mq.jobs.read_models import (
    AckResult,
    DeliveredGroup,
    Delivery,
    ExtendResult,
    GroupLease,
    GroupResult,
)
from polar_mq.jobs.results import build_groups, group_id
from polar_mq.lifecycle.completeness import group_query
from polar_mq.models import GroupDelivery, StaleGroup
from polar_mq.models.base import utcnow
from polar_mq.policy.admission import admit
from polar_mq.policy.staleness import judge_staleness, oldest_allowed, too_old_calls
from polar_mq.policy.state import current_version
from polar_mq.spec import load_spec

JUDGE_PER_LEASE = 256
"""Free complete groups whose staleness one lease call records (the next calls do the rest)."""
CLAIM_ROUNDS = 3
"""Candidates lost to a concurrent consumer are replaced by the next ones, this many times."""


class UnknownDelivery(PolarError, LookupError):
    """A delivery id this job never handed out (the API answers 404)."""

    status = 404
    type = "unknown_delivery"


class DeliveryConflict(PolarError):
    """A delivery the caller may no longer act on (the API answers 409 with `type`)."""

    status = 409

    def __init__(self, type: str, message: str) -> None:
        super().__init__(message, type=type)


def delivery_id(job_id: uuid.UUID, task_index: int, count: int) -> str:
    return f"{group_id(job_id, task_index)}:{count}"


def _parse_delivery(job_id: uuid.UUID, value: str) -> tuple[int, int] | None:
    """(task_index, delivery_count) of a delivery id of this job, or None."""
    parts = value.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != str(job_id):
        return None
    try:
        task_index, count = int(parts[1]), int(parts[2])
    except ValueError:
        return None
    return (task_index, count) if task_index >= 0 and count >= 1 else None


# --------------------------------------------------------------------------------------------
# Lease


def lease_groups(
    session: Session,
    job_id: uuid.UUID,
    consumer: str,
    max_groups: int,
    lease_s: float,
    *,
    max_in_flight: int | None = None,
    include_trajectories: bool = False,
    advantages: str | None = None,
) -> GroupLease:
    """Lease up to `max_groups` complete groups to `consumer`, oldest completion first.

    Groups never handed out and groups whose lease expired unacked are both candidates, in one
    completion order (so a redelivery comes before younger groups). `max_in_flight` caps the
    unacked live leases this consumer may hold, which is the stream's flow control.
    """
    job = get_job(session, job_id)
    now = utcnow()
    # Read before the candidates: a job seen finished here has every group complete for the
    # query below, so `job_finished` never goes out with a group still left behind it.
    total, terminal = rollout_totals(session, job_id)
    finished = total > 0 and terminal == total
    oldest = _judge_staleness(session, job, consumer, now)
    want = max_groups
    if max_in_flight is not None:
        want = min(want, max_in_flight - _held(session, job_id, consumer, now))
    claimed: list[tuple[Any, Delivery]] = []
    for _ in range(CLAIM_ROUNDS):
        if want <= 0:
            break
        candidates = _candidates(session, job_id, now, want, oldest)
        won = _claim(session, job_id, consumer, [c.task_index for c in candidates], now, lease_s)
        claimed.extend((c, won[c.task_index]) for c in candidates if c.task_index in won)
        want -= len(won)
        if len(candidates) < want + len(won):  # every candidate there was was tried
            break
    rows = [row for row, _ in claimed]
    groups = build_groups(session, job_id, rows, True, include_trajectories, advantages)
    delivered = [_delivered(g, d) for g, (_, d) in zip(groups, claimed, strict=True)]
    return _lease_answer(session, job, consumer, delivered, now, finished)


def _judge_staleness(session: Session, job: Any, consumer: str, now: datetime) -> int | None:
    """For a job with `staleness`: record which of the next groups to hand out became stale
    (freeing capacity, so admit more) and return the oldest policy version a group may hold to
    be handed out (the candidates query enforces it, whatever was recorded)."""
    staleness = load_spec(job.spec).staleness
    if staleness is None:
        return None
    version = current_version(session)
    waiting = [c.task_index for c in _candidates(session, job.id, now, JUDGE_PER_LEASE, None)]
    if judge_staleness(session, job, version, worker=f"lease:{consumer}", only=waiting):
        admit(session, job.id, version, worker=f"lease:{consumer}")
    return oldest_allowed(staleness, version)


def _held(session: Session, job_id: uuid.UUID, consumer: str, now: datetime) -> int:
    d = GroupDelivery
    return int(
        session.scalar(
            select(func.count()).where(
                d.job_id == job_id,
                d.consumer == consumer,
                d.acked_at.is_(None),
                d.lease_expires_at > now,
            )
        )
        or 0
    )


def _candidates(
    session: Session, job_id: uuid.UUID, now: datetime, limit: int, oldest: int | None
) -> list[Any]:
    """Complete groups that are free to lease (never leased, or lease expired unacked), never
    recorded stale, and when `oldest` is given, none of whose tokens is older than that."""
    groups = group_query(job_id, complete_only=True).subquery()
    d = GroupDelivery
    free = or_(d.task_index.is_(None), and_(d.acked_at.is_(None), d.lease_expires_at <= now))
    recorded = select(StaleGroup.task_index).where(
        StaleGroup.job_id == job_id, StaleGroup.task_index == groups.c.task_index
    )
    free = and_(free, ~recorded.exists())
    if oldest is not None:
        free = and_(free, ~too_old_calls(job_id, oldest, groups.c.task_index))
    query = (
        select(groups.c.task_index, groups.c.n, groups.c.n_terminal, groups.c.completed_at)
        .outerjoin(d, and_(d.job_id == job_id, d.task_index == groups.c.task_index))
        .where(free)
        .order_by(groups.c.completed_at, groups.c.task_index)
        .limit(limit)
    )
    return list(session.execute(query).all())


def _claim(
    session: Session,
    job_id: uuid.UUID,
    consumer: str,
    indexes: Sequence[int],
    now: datetime,
    lease_s: float,
) -> dict[int, Delivery]:
    """Atomically take the free groups among `indexes`; the ones taken, with their delivery.

    Rows are written in task order, so two consumers claiming overlapping sets take their row
    locks in the same order and cannot deadlock.
    """
    if not indexes:
        return {}
    expires = now + timedelta(seconds=lease_s)
    values = [
        {
            "job_id": job_id, "task_index": index, "consumer": consumer, "delivery_count": 1,
            "leased_at": now, "lease_expires_at": expires, "acked_at": None,
        }
        for index in sorted(indexes)
    ]  # fmt: skip
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    d = GroupDelivery
    stmt = insert(d).values(values)
    claim = stmt.on_conflict_do_update(
        index_elements=[d.job_id, d.task_index],
        set_={
            "consumer": stmt.excluded.consumer,
            "delivery_count": d.delivery_count + 1,
            "leased_at": stmt.excluded.leased_at,
            "lease_expires_at": stmt.excluded.lease_expires_at,
        },
        where=and_(d.acked_at.is_(None), d.lease_expires_at <= now),
    ).returning(d.task_index, d.delivery_count)
    won: dict[int, Delivery] = {}
    for index, count in session.execute(claim).tuples():
        won[index] = Delivery(
            delivery_id=delivery_id(job_id, index, count),
            consumer=consumer,
            delivery_count=count,
            redelivered=count > 1,
            leased_at=now,
            lease_expires_at=expires,
        )
    return won


def _delivered(group: GroupResult, delivery: Delivery) -> DeliveredGroup:
    values = {f.name: getattr(group, f.name) for f in fields(GroupResult)}
    return DeliveredGroup(**values, delivery=delivery)


def _lease_answer(
    session: Session,
    job: Any,
    consumer: str,
    groups: list[DeliveredGroup],
    now: datetime,
    finished: bool,
) -> GroupLease:
    d = GroupDelivery
    in_flight = case((and_(d.acked_at.is_(None), d.lease_expires_at > now), 1), else_=0)
    acked, flying = (
        session.execute(
            select(func.count(d.acked_at), func.coalesce(func.sum(in_flight), 0)).where(
                d.job_id == job.id
            )
        )
        .tuples()
        .one()
    )
    stale = 0
    if load_spec(job.spec).staleness is not None:  # only such jobs ever have stale groups
        stale = int(session.scalar(select(func.count()).where(StaleGroup.job_id == job.id)) or 0)
    return GroupLease(
        job_id=job.id,
        consumer=consumer,
        groups=groups,
        job_finished=finished,
        groups_total=job.n_tasks,
        groups_acked=int(acked),
        groups_in_flight=int(flying),
        done=finished and int(acked) + stale >= job.n_tasks,
        groups_stale=stale,
    )


# --------------------------------------------------------------------------------------------
# Acknowledge and extend


@dataclass(frozen=True, slots=True)
class _Target:
    delivery_id: str
    task_index: int
    count: int


def _targets(job_id: uuid.UUID, delivery_ids: Sequence[str]) -> list[_Target]:
    targets, unknown = [], []
    for value in dict.fromkeys(delivery_ids):
        parsed = _parse_delivery(job_id, value)
        if parsed is None:
            unknown.append(value)
        else:
            targets.append(_Target(value, *parsed))
    if unknown:
        raise UnknownDelivery(f"job {job_id} never handed out delivery {', '.join(unknown)}")
    return targets


def _refuse(
    session: Session,
    job_id: uuid.UUID,
    consumer: str,
    missed: Sequence[_Target],
    acked_is_ok: bool,
) -> list[str]:
    """Explain why the conditional UPDATE skipped `missed`: raise, or return the ones this
    consumer had already acknowledged (idempotent acks, when `acked_is_ok`)."""
    if not missed:
        return []
    d = GroupDelivery
    rows = {
        row.task_index: row
        for row in session.execute(
            select(d.task_index, d.delivery_count, d.consumer, d.acked_at).where(
                d.job_id == job_id, d.task_index.in_([t.task_index for t in missed])
            )
        )
    }
    unknown: list[str] = []
    superseded: list[str] = []
    foreign: list[str] = []
    acked: list[str] = []
    already: list[str] = []
    for t in missed:
        row = rows.get(t.task_index)
        if row is None or row.delivery_count < t.count:
            unknown.append(t.delivery_id)
        elif row.delivery_count > t.count:
            superseded.append(t.delivery_id)
        elif row.consumer != consumer:
            foreign.append(t.delivery_id)
        else:
            (already if acked_is_ok else acked).append(t.delivery_id)
    if unknown:
        raise UnknownDelivery(f"job {job_id} never handed out delivery {', '.join(unknown)}")
    if superseded:
        raise DeliveryConflict(
            "delivery_superseded",
            f"lease expired and the group was handed out again: {', '.join(superseded)}"
            " (train on the newer delivery's copy, or skip it)",
        )
    if foreign:
        raise DeliveryConflict(
            "not_your_delivery",
            f"leased to another consumer, not {consumer!r}: {', '.join(foreign)}",
        )
    if acked:
        raise DeliveryConflict("already_acked", f"already acknowledged: {', '.join(acked)}")
    return already


def _mine(job_id: uuid.UUID, consumer: str, targets: Sequence[_Target]) -> Any:
    d = GroupDelivery
    return and_(
        d.job_id == job_id,
        d.consumer == consumer,
        d.acked_at.is_(None),
        tuple_(d.task_index, d.delivery_count).in_([(t.task_index, t.count) for t in targets]),
    )


def ack_groups(
    session: Session, job_id: uuid.UUID, consumer: str, delivery_ids: Sequence[str]
) -> AckResult:
    """Acknowledge deliveries: the groups are never handed out again. All or nothing.

    An ack after the lease expired is still accepted while nobody re-leased the group: the
    trainer did consume it, and accepting spares a pointless redelivery. Once another consumer
    holds it, the old delivery is superseded (409): exactly one delivery of a group is acked.
    Acking the same delivery twice by its consumer is fine (`already_acked`).
    """
    get_job(session, job_id)
    targets = _targets(job_id, delivery_ids)
    if not targets:
        return AckResult([], [])
    d = GroupDelivery
    done = set(
        session.execute(
            update(d)
            .where(_mine(job_id, consumer, targets))
            .values(acked_at=utcnow())
            .returning(d.task_index, d.delivery_count)
            .execution_options(synchronize_session=False)
        ).tuples()
    )
    missed = [t for t in targets if (t.task_index, t.count) not in done]
    already = _refuse(session, job_id, consumer, missed, acked_is_ok=True)
    acked = [t.delivery_id for t in targets if (t.task_index, t.count) in done]
    return AckResult(acked=acked, already_acked=already)


def extend_leases(
    session: Session,
    job_id: uuid.UUID,
    consumer: str,
    delivery_ids: Sequence[str],
    lease_s: float,
) -> ExtendResult:
    """Push the leases of unacked deliveries to now + lease_s (a slow trainer keeps its groups).

    Like acks, an expired lease nobody re-leased can still be extended; all or nothing.
    """
    get_job(session, job_id)
    targets = _targets(job_id, delivery_ids)
    expires = utcnow() + timedelta(seconds=lease_s)
    d = GroupDelivery
    done: set[tuple[int, int]] = set()
    if targets:
        done = set(
            session.execute(
                update(d)
                .where(_mine(job_id, consumer, targets))
                .values(lease_expires_at=expires)
                .returning(d.task_index, d.delivery_count)
                .execution_options(synchronize_session=False)
            ).tuples()
        )
    missed = [t for t in targets if (t.task_index, t.count) not in done]
    _refuse(session, job_id, consumer, missed, acked_is_ok=False)
    return ExtendResult(extended=[t.delivery_id for t in targets], lease_expires_at=expires)
