"""Over-provisioning and early stop on real PostgreSQL: when a group is complete with N usable
samples, what happens to its stragglers (cancelled or withheld), the job stop at M groups, and the
race of two rollouts of a group (or two groups) ending at once."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.deliveries import lease_groups
from polar_mq.jobs.early_stop import StopApplied, after_rollout_ended
from polar_mq.jobs.queries import job_status
from polar_mq.jobs.results import job_results
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.outbox import attach_publisher
from polar_mq.models import Event, EventKind, Job, Rollout, RolloutStatus
from polar_mq.models.base import utcnow
from polar_mq.spec import load_spec


@pytest.fixture()
def factory(db_session_factory: sessionmaker[Session]) -> sessionmaker[Session]:
    def publish(_messages: Sequence[StageMessage]) -> None:
        pass

    attach_publisher(db_session_factory, publish)
    return db_session_factory


def _job(factory: sessionmaker[Session], n_tasks: int, samples: int, **stop: Any) -> uuid.UUID:
    spec = JobCreate.model_validate(
        {
            "tasks": [{"instruction": f"task {i}"} for i in range(n_tasks)],
            "samples_per_task": samples,
            "stop": stop,
        }
    )
    with unit_of_work(factory) as session:
        return create_job(session, spec, "cpu").job_id


def _groups(factory: sessionmaker[Session], job_id: uuid.UUID) -> list[list[uuid.UUID]]:
    with factory() as session:
        rows = session.execute(
            select(Rollout.task_index, Rollout.id)
            .where(Rollout.job_id == job_id)
            .order_by(Rollout.task_index, Rollout.sample_index)
        ).all()
    out: dict[int, list[uuid.UUID]] = {}
    for index, rid in rows:
        out.setdefault(index, []).append(rid)
    return [out[i] for i in sorted(out)]


def _end(
    factory: sessionmaker[Session],
    rollout_id: uuid.UUID,
    reason: str = "completed",
    reward: float | None = 1.0,
    at: datetime | None = None,
) -> None:
    """Record a rollout's end as the workers do: status, reason, reward, finished_at."""
    failed = reason in ("runtime_error", "backend_error", "worker_lost")
    values = {
        "status": RolloutStatus.FAILED if failed else RolloutStatus.COMPLETED,
        "termination_reason": reason,
        "reward": None if failed else reward,
        "finished_at": at or utcnow(),
    }
    with unit_of_work(factory) as session:
        session.execute(update(Rollout).where(Rollout.id == rollout_id).values(**values))


def _check(
    factory: sessionmaker[Session], job_id: uuid.UUID, task_index: int, worker: str = "test"
) -> StopApplied:
    """The workers' hook: its own transaction, after the rollout's end was committed."""
    with unit_of_work(factory) as session:
        spec = load_spec(session.get_one(Job, job_id).spec)
        return after_rollout_ended(session, job_id, task_index, spec, worker)


def _statuses(factory: sessionmaker[Session], ids: Sequence[uuid.UUID]) -> list[str]:
    with factory() as session:
        rows = session.execute(select(Rollout.id, Rollout.status).where(Rollout.id.in_(ids)))
        by_id = {rid: status for rid, status in rows}
    return [by_id[i] for i in ids]


def _cancel_events(factory: sessionmaker[Session], job_id: uuid.UUID) -> list[Event]:
    with factory() as session:
        return list(
            session.scalars(
                select(Event).where(Event.job_id == job_id, Event.kind == EventKind.CANCELLED)
            )
        )


def _results(factory: sessionmaker[Session], job_id: uuid.UUID, **kw: Any) -> Any:
    with factory() as session:
        return job_results(session, job_id, settle_s=0, advantages="grpo", **kw)


# --------------------------------------------------------------------------------------------
# The spec


@pytest.mark.parametrize(
    ("samples", "stop", "message"),
    [
        (4, {"usable_samples_per_group": 5}, "exceeds samples_per_task"),
        (4, {"groups": 3}, "exceeds the number of tasks"),
        (4, {}, "needs usable_samples_per_group, groups, or both"),
        (4, {"groups": 1, "stragglers": "ignore"}, "stragglers"),
        (4, {"usable_samples_per_group": 0}, "usable_samples_per_group"),
        (4, {"groups": 1, "typo": 1}, "typo"),
    ],
)
def test_stop_rules_that_cannot_be_met_are_refused(
    samples: int, stop: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        JobCreate.model_validate(
            {"tasks": [{"instruction": "a"}, {"instruction": "b"}], "samples_per_task": samples,
             "stop": stop}
        )  # fmt: skip


def test_the_stop_rule_is_stored_with_the_job(factory: sessionmaker[Session]) -> None:
    job_id = _job(factory, 2, 3, usable_samples_per_group=2)
    with factory() as session:
        assert session.get_one(Job, job_id).spec["stop"] == {
            "usable_samples_per_group": 2,
            "stragglers": "cancel",
        }


# --------------------------------------------------------------------------------------------
# usable_samples_per_group


def test_a_group_is_complete_once_n_samples_ended_usable(factory: sessionmaker[Session]) -> None:
    job_id = _job(factory, 2, 4, usable_samples_per_group=2, stragglers="withhold")
    (a, b, _, _), _ = _groups(factory, job_id)
    t0 = utcnow() - timedelta(seconds=30)
    _end(factory, a, reward=1.0, at=t0)
    assert _results(factory, job_id).groups == []  # one usable sample is not enough
    _end(factory, b, reward=0.0, at=t0 + timedelta(seconds=1))

    (group,) = _results(factory, job_id).groups
    assert group.task_index == 0 and group.complete and not group.incomplete
    assert group.completed_at == t0 + timedelta(seconds=1)  # when the 2nd usable one ended
    assert (group.n_usable, group.mean_reward, group.n_samples) == (2, 0.5, 4)
    assert [(s.usable, s.straggler) for s in group.samples] == [
        (True, False), (True, False), (False, True), (False, True),
    ]  # fmt: skip
    assert [s.advantage is not None for s in group.samples] == [True, True, False, False]

    with factory() as session:
        lease = lease_groups(session, job_id, "trainer", 10, 30.0)
        status = job_status(session, job_id)
        session.commit()
    assert [g.task_index for g in lease.groups] == [0]  # the stream agrees with the pages
    assert status.groups_complete == 1 and status.state == "running"
    all_groups = _results(factory, job_id, complete_only=False).groups
    assert [g.complete for g in all_groups] == [True, False]


def test_infrastructure_failures_never_count_as_usable(factory: sessionmaker[Session]) -> None:
    job_id = _job(factory, 1, 4, usable_samples_per_group=2)
    ((a, b, c, d),) = _groups(factory, job_id)
    _end(factory, a, reason="runtime_error")
    _end(factory, b, reason="worker_lost")
    _end(factory, c, reward=1.0)
    assert _check(factory, job_id, 0) == StopApplied()
    assert _results(factory, job_id).groups == []  # 3 ended, 1 usable: still running
    assert _statuses(factory, [d]) == [RolloutStatus.QUEUED]

    _end(factory, d, reason="agent_error", reward=0.0)  # an agent outcome is usable
    (group,) = _results(factory, job_id).groups
    assert group.complete and not group.incomplete and group.n_usable == 2


def test_all_ended_with_fewer_than_n_usable_is_complete_but_incomplete(
    factory: sessionmaker[Session],
) -> None:
    job_id = _job(factory, 1, 3, usable_samples_per_group=2)
    ((a, b, c),) = _groups(factory, job_id)
    _end(factory, a, reward=1.0)
    _end(factory, b, reason="backend_error")
    _end(factory, c, reward=None)  # the evaluator could not score it
    (group,) = _results(factory, job_id).groups
    assert group.complete and group.incomplete and group.n_usable == 1


def test_stragglers_are_cancelled_with_an_early_stop_event(factory: sessionmaker[Session]) -> None:
    job_id = _job(factory, 2, 4, usable_samples_per_group=2)
    (a, b, c, d), others = _groups(factory, job_id)
    with unit_of_work(factory) as session:  # one straggler is mid-agent
        session.execute(
            update(Rollout)
            .where(Rollout.id == c)
            .values(status=RolloutStatus.RUNNING, lease_owner="node/1/t")
        )
    _end(factory, a)
    assert _check(factory, job_id, 0) == StopApplied()
    _end(factory, b)
    applied = _check(factory, job_id, 0)

    assert sorted(applied.stragglers_cancelled) == sorted([c, d]) and not applied.job_stopped
    assert _statuses(factory, [a, b, c, d]) == ["completed", "completed", "cancelled", "cancelled"]
    assert _statuses(factory, others) == ["queued"] * 4  # other groups untouched
    events = _cancel_events(factory, job_id)
    assert sorted(e.rollout_id for e in events if e.rollout_id) == sorted([c, d])
    assert all(e.detail["early_stop"] == "group_complete" for e in events)
    with factory() as session:
        lease_owner = session.get_one(Rollout, c).lease_owner
    assert lease_owner is None  # the agent's worker loses its lease at the next heartbeat

    assert _check(factory, job_id, 0) == StopApplied()  # idempotent
    assert len(_cancel_events(factory, job_id)) == 2
    (group,) = _results(factory, job_id).groups
    assert group.n_usable == 2 and not group.incomplete
    assert [s.termination_reason for s in group.samples] == [
        "completed", "completed", "cancelled", "cancelled",
    ]  # fmt: skip


def test_withheld_stragglers_run_on_but_never_join_the_group(
    factory: sessionmaker[Session],
) -> None:
    job_id = _job(factory, 1, 3, usable_samples_per_group=2, stragglers="withhold")
    ((a, b, c),) = _groups(factory, job_id)
    t0 = utcnow() - timedelta(seconds=30)
    _end(factory, a, reward=1.0, at=t0)
    _end(factory, b, reward=0.0, at=t0 + timedelta(seconds=1))
    assert _check(factory, job_id, 0) == StopApplied()  # nothing is cancelled
    assert _statuses(factory, [c]) == ["queued"]
    with factory() as session:
        first = lease_groups(session, job_id, "trainer", 10, 0.001)
        session.commit()
    (delivered,) = first.groups
    assert not first.job_finished  # the straggler still runs

    _end(factory, c, reward=1.0, at=t0 + timedelta(seconds=5))  # the straggler ends, usable
    (group,) = _results(factory, job_id).groups
    assert group.completed_at == delivered.completed_at  # completion does not move
    assert (group.n_usable, group.mean_reward) == (2, 0.5)  # same group as delivered
    straggler = group.samples[2]
    assert straggler.straggler and not straggler.usable and straggler.advantage is None
    assert straggler.status == "completed" and straggler.reward == 1.0  # visible in results

    with factory() as session:  # the lease expired: the redelivery is the same group
        again = lease_groups(session, job_id, "trainer", 10, 30.0)
        session.commit()
    (redelivered,) = again.groups
    assert redelivered.delivery.delivery_count == 2
    assert (redelivered.n_usable, redelivered.mean_reward) == (2, 0.5)
    assert again.job_finished


# --------------------------------------------------------------------------------------------
# groups: M


def test_the_job_stops_at_m_complete_groups(factory: sessionmaker[Session]) -> None:
    job_id = _job(factory, 4, 2, groups=2)
    (a0, a1), (b0, b1), (c0, c1), (d0, d1) = _groups(factory, job_id)
    _end(factory, c0)  # group 2 half done: it will be cut short
    _end(factory, a0)
    _end(factory, a1)
    assert _check(factory, job_id, 0) == StopApplied()  # 1 group of 2
    _end(factory, b0, reason="worker_lost")
    _end(factory, b1)  # complete, with an infrastructure failure: it counts as complete
    applied = _check(factory, job_id, 1)

    assert applied.job_stopped and sorted(applied.rollouts_cancelled) == sorted([c1, d0, d1])
    assert _statuses(factory, [c0, c1, d0, d1]) == ["completed", *["cancelled"] * 3]
    assert all(e.detail["early_stop"] == "job_stopped" for e in _cancel_events(factory, job_id))
    with factory() as session:
        status = job_status(session, job_id)
    assert status.state == "stopped" and status.stop is not None
    assert status.stop.stopped and status.stop.stopped_at is not None
    assert (status.stop.groups, status.stop.groups_complete_at_stop) == (2, 2)
    assert (status.stop.groups_stopped, status.stop.rollouts_cancelled) == (2, 3)
    assert status.groups_complete == 4 and status.terminal == status.total  # all ended

    assert _check(factory, job_id, 2) == StopApplied()  # stopping again changes nothing
    with factory() as session:
        stops = session.scalar(
            select(func.count()).where(Event.job_id == job_id, Event.kind == EventKind.STOPPED)
        )
    assert stops == 1
    groups = _results(factory, job_id).groups
    cut = [g.task_index for g in groups if g.incomplete]
    assert sorted(cut) == [1, 2, 3]  # b had a failure; c and d were cut short


def test_both_rules_together(factory: sessionmaker[Session]) -> None:
    job_id = _job(factory, 3, 3, usable_samples_per_group=1, groups=2)
    (a0, a1, a2), (b0, b1, b2), rest = _groups(factory, job_id)
    _end(factory, a0)
    first = _check(factory, job_id, 0)
    assert sorted(first.stragglers_cancelled) == sorted([a1, a2]) and not first.job_stopped
    _end(factory, b0)
    applied = _check(factory, job_id, 1)
    assert sorted(applied.stragglers_cancelled) == sorted([b1, b2])
    assert applied.job_stopped and sorted(applied.rollouts_cancelled) == sorted(rest)
    with factory() as session:
        assert job_status(session, job_id).stop.groups_stopped == 1  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------------
# Races on PostgreSQL


def _concurrently(*calls: Any) -> list[Any]:
    """Run the calls in threads released together; their results in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return results


@pytest.mark.parametrize("attempt", range(5))
def test_two_samples_ending_at_once_stop_the_group_exactly_once(
    factory: sessionmaker[Session], attempt: int
) -> None:
    """Both commit, then both checks run at the same time: one cancels, the other finds nothing
    left to cancel (it waits on the row locks and re-checks), and no straggler is missed."""
    job_id = _job(factory, 1, 5, usable_samples_per_group=2)
    ((a, b, *stragglers),) = _groups(factory, job_id)

    def end_then_check(rid: uuid.UUID) -> StopApplied:
        _end(factory, rid)
        return _check(factory, job_id, 0, worker=f"w-{rid}")

    first, second = _concurrently(lambda: end_then_check(a), lambda: end_then_check(b))
    cancelled = first.stragglers_cancelled + second.stragglers_cancelled
    assert sorted(cancelled) == sorted(stragglers)  # all of them, each by exactly one check
    events = _cancel_events(factory, job_id)
    assert sorted(e.rollout_id for e in events if e.rollout_id) == sorted(stragglers)


def test_a_check_that_saw_one_sample_is_followed_by_one_that_sees_both(
    factory: sessionmaker[Session],
) -> None:
    """The interleaving a same-transaction check would miss: A ends and checks before B's end is
    committed. B's check runs after B's commit, so it sees both."""
    job_id = _job(factory, 1, 3, usable_samples_per_group=2)
    ((a, b, c),) = _groups(factory, job_id)
    with unit_of_work(factory) as b_session:
        b_session.execute(
            update(Rollout).where(Rollout.id == b).values(
                status=RolloutStatus.COMPLETED, termination_reason="completed", reward=1.0,
                finished_at=utcnow(),
            )
        )  # fmt: skip
        _end(factory, a)  # A commits while B's end is in flight
        assert _check(factory, job_id, 0) == StopApplied()  # A's check cannot see B yet
    applied = _check(factory, job_id, 0)  # B's check, after B's commit
    assert applied.stragglers_cancelled == [c]


def test_a_check_waits_for_a_concurrent_stop_and_does_not_repeat_it(
    factory: sessionmaker[Session],
) -> None:
    """Two groups complete at once with groups: 1. The first check holds the job stop open; the
    second blocks on its row locks, then finds the job stopped and does nothing."""
    job_id = _job(factory, 3, 1, groups=1)
    (a,), (b,), (c,) = _groups(factory, job_id)
    _end(factory, a)
    _end(factory, b)
    first = factory()
    try:
        spec = load_spec(first.get_one(Job, job_id).spec)
        applied = after_rollout_ended(first, job_id, 0, spec, "first")
        assert applied.job_stopped and applied.rollouts_cancelled == [c]
        done: list[StopApplied] = []
        second = threading.Thread(target=lambda: done.append(_check(factory, job_id, 1)))
        second.start()
        second.join(0.5)
        assert second.is_alive()  # blocked on the job row the first check is stopping
        first.commit()
    finally:
        first.close()
    second.join(30)
    assert done == [StopApplied()]
    with factory() as session:
        n = session.scalar(
            select(func.count()).where(Event.job_id == job_id, Event.kind == EventKind.STOPPED)
        )
    assert n == 1 and len(_cancel_events(factory, job_id)) == 1


@pytest.mark.parametrize("attempt", range(5))
def test_the_mth_group_completing_concurrently_never_misses_the_stop(
    factory: sessionmaker[Session], attempt: int
) -> None:
    job_id = _job(factory, 4, 1, groups=2)
    (a,), (b,), (c,), (d,) = _groups(factory, job_id)

    def end_then_check(rid: uuid.UUID, index: int) -> StopApplied:
        _end(factory, rid)
        return _check(factory, job_id, index)

    results = _concurrently(lambda: end_then_check(a, 0), lambda: end_then_check(b, 1))
    assert sum(r.job_stopped for r in results) == 1
    assert sorted(r for x in results for r in x.rollouts_cancelled) == sorted([c, d])
    with factory() as session:
        assert session.get_one(Job, job_id).status == "stopped"
