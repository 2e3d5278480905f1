"""Prepare admission's decision (`workers.admission`): the backlog bound against the window, the
count that may lag, fail-open without a recent count; the launcher handing the node's run-agent
concurrency to its prepare worker; the count itself on PostgreSQL. Time is passed in."""

from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import text, update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Rollout, RolloutStatus
from polar_mq.workers.admission import (
    STALE_AFTER_S,
    AdmissionGate,
    PreparedCount,
    PreparedCounter,
    admission_window,
    prepared_on_node,
)
from polar_mq.workers.launcher import (
    ADMISSION_WINDOW_ENV,
    StageWorker,
    parse_concurrency,
    plan_workers,
)


def held(*ids: str) -> frozenset[str]:
    return frozenset(ids)


def gate_with(window: int, prepared: int, now: float = 100.0) -> AdmissionGate:
    gate = AdmissionGate(window)
    gate.counted(PreparedCount(prepared=prepared, finished_before=gate.finished(), began_at=now))
    return gate


def test_pauses_when_prepared_and_held_reach_the_window() -> None:
    gate = gate_with(window=3, prepared=1)
    assert gate.decide(held("a"), 100.1).pause is False  # 1 prepared + 1 held = 2 < 3
    verdict = gate.decide(held("a", "b"), 100.2)  # 1 + 2 = 3
    assert (verdict.pause, verdict.backlog) == (True, 3)


def test_resumes_below_the_window_without_hysteresis() -> None:
    gate = gate_with(window=2, prepared=2)
    assert gate.decide(held(), 100.1).pause is True
    gate.counted(PreparedCount(prepared=1, finished_before=gate.finished(), began_at=100.5))
    verdict = gate.decide(held(), 100.6)  # an agent started: one more fits
    assert (verdict.pause, verdict.backlog) == (False, 1)


def test_a_prepare_finished_after_the_count_began_still_counts() -> None:
    """The count may have read the rollout before its prepare committed: the message that left
    since the count began is counted, so the backlog is never under the truth."""
    gate = AdmissionGate(window=2)
    gate.decide(held("a"), 100.0)  # a arrives
    gate.counted(PreparedCount(prepared=0, finished_before=gate.finished(), began_at=100.0))
    verdict = gate.decide(held(), 100.2)  # a left: prepared meanwhile, not in that count
    assert (verdict.backlog, verdict.recount) == (1, True)  # and a new count is asked for
    gate.counted(PreparedCount(prepared=1, finished_before=gate.finished(), began_at=100.5))
    again = gate.decide(held(), 100.6)  # the next count has it instead: not twice
    assert (again.backlog, again.recount) == (1, False)


def test_messages_that_left_before_the_count_began_are_not_counted_again() -> None:
    gate = AdmissionGate(window=5)
    gate.decide(held("a", "b"), 100.0)
    gate.decide(held(), 100.1)  # both left before the count below began
    gate.counted(PreparedCount(prepared=2, finished_before=gate.finished(), began_at=100.2))
    assert gate.decide(held("c"), 100.3).backlog == 3


def test_fails_open_without_a_recent_count() -> None:
    gate = AdmissionGate(window=1)
    never = gate.decide(held("a", "b"), 100.0)
    assert (never.pause, never.backlog) == (False, None)
    gate.counted(PreparedCount(prepared=5, finished_before=0, began_at=100.0))
    assert gate.decide(held(), 100.0 + STALE_AFTER_S - 0.1).pause is True  # a blip keeps it
    stale = gate.decide(held(), 100.0 + STALE_AFTER_S + 0.1)
    assert (stale.pause, stale.backlog) == (False, None)


def test_a_window_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        AdmissionGate(0)


def test_the_window_defaults_to_the_run_agent_concurrency() -> None:
    assert admission_window(Settings()) == parse_concurrency(None)[Stage.RUN_AGENT]
    assert admission_window(Settings(prepare_admission_window=3)) == 3
    assert admission_window(Settings(prepare_admission_window=0)) == 0


def _by_stage(workers: list[StageWorker]) -> dict[Stage, StageWorker]:
    return {w.stage: w for w in workers}


def test_the_launcher_gives_its_prepare_worker_the_nodes_agent_slots() -> None:
    plan = _by_stage(
        plan_workers(Settings(), list(Stage), parse_concurrency("run_agent=5"), "threads")
    )
    assert plan[Stage.PREPARE].env == {ADMISSION_WINDOW_ENV: "5"}
    assert all(not plan[s].env for s in Stage if s is not Stage.PREPARE)
    # an operator's own window is left as they set it (the workers inherit the environment)
    mine = plan_workers(
        Settings(prepare_admission_window=2), [Stage.PREPARE], parse_concurrency(None), "threads"
    )
    assert mine[0].env == {}
    # and the worker reads what it was handed
    assert Settings(**{"prepare_admission_window": "5"}).prepare_admission_window == 5


def test_the_counter_feeds_the_gate_and_keeps_the_last_count_on_failure() -> None:
    gate = AdmissionGate(window=2)
    results: list[int | Exception] = [4, RuntimeError("database away"), 1]

    def count() -> int:
        result = results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    counter = PreparedCounter(gate, count)
    assert counter.wait_first(0) is False
    assert counter.count_once() is True
    assert counter.wait_first(0) is True
    assert gate.decide(held(), time.monotonic()).backlog == 4
    assert counter.count_once() is False
    assert gate.decide(held(), time.monotonic()).backlog == 4  # the last count stays
    assert counter.count_once() is True
    assert gate.decide(held(), time.monotonic()).backlog == 1


def test_the_counter_counts_soon_while_the_count_falls_and_backs_off_after() -> None:
    gate = AdmissionGate(window=2)
    results = [5, 4, 4, 4, 4, 4, 4, 4]
    counter = PreparedCounter(gate, lambda: results.pop(0), poll_s=0.5, gap_s=0.05)
    waits = []
    for _ in range(len(results)):
        counter.count_once()
        waits.append(counter.next_wait)
    assert waits == [0.5, 0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5]


def test_the_counter_counts_again_when_asked() -> None:
    """Between two polls an hour apart, `recount` gets a count at once (no time is asserted: a
    broken one would wait the hour: the loop gives up after 30 s)."""
    gate = AdmissionGate(window=2)
    counts: list[float] = []

    def count() -> int:
        counts.append(time.monotonic())
        return 0

    counter = PreparedCounter(gate, count, poll_s=3600, gap_s=0).start()
    try:
        assert counter.wait_first(30)
        counter.recount()
        deadline = time.monotonic() + 30
        while len(counts) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(counts) >= 2
    finally:
        counter.stop()


def _rollout(factory: sessionmaker[Session], status: str, node: str | None) -> uuid.UUID:
    spec = JobCreate.model_validate({"tasks": [{"instruction": "x"}]})
    with unit_of_work(factory) as session:
        rid = create_job(session, spec, "p").rollout_ids[0]
        session.execute(update(Rollout).where(Rollout.id == rid).values(status=status, node=node))
    return rid


def test_the_count_is_this_nodes_prepared_rollouts(
    pg_url: str, db_session_factory: sessionmaker[Session]
) -> None:
    for status, node in [
        (RolloutStatus.PREPARED, "n1"), (RolloutStatus.PREPARED, "n1"),
        (RolloutStatus.PREPARED, "n2"), (RolloutStatus.RUNNING, "n1"),
        (RolloutStatus.QUEUED, None),
    ]:  # fmt: skip
        _rollout(db_session_factory, status, node)
    count = prepared_on_node(Settings(database_url=pg_url, node_name="n1"))
    assert count() == 2
    # the held connection sees what committed since (no snapshot kept between counts)
    _rollout(db_session_factory, RolloutStatus.PREPARED, "n1")
    assert count() == 3


def test_a_count_whose_connection_the_server_closed_connects_again(
    pg_url: str, db_session_factory: sessionmaker[Session]
) -> None:
    _rollout(db_session_factory, RolloutStatus.PREPARED, "n1")

    def counting_backends() -> set[int]:
        with db_session_factory() as session:
            return set(session.scalars(
                text("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                     "AND pid <> pg_backend_pid() AND query LIKE 'SELECT count(*)%'")
            ))  # fmt: skip

    others = counting_backends()  # earlier tests' counters
    count = prepared_on_node(Settings(database_url=pg_url, node_name="n1"))
    assert count() == 1
    (mine,) = counting_backends() - others  # held between counts
    with db_session_factory() as session:
        session.execute(text("SELECT pg_terminate_backend(:p)"), {"p": mine})
    assert count() == 1  # connected again
    assert counting_backends() - others - {mine}


def test_an_unreachable_database_is_a_failed_count_soon() -> None:
    count = prepared_on_node(Settings(database_url="postgresql://postgres@127.0.0.1:1/none"))
    with pytest.raises(Exception, match="connect"):
        count()
