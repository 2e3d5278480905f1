"""A rollout cancelled while its agent runs: the agent stage stops at once, in a real process.

The real prepare and run-agent stages run here (`runner.run_stage`, a real `local` runtime and a
real `sleep` agent), the lease keeper on a short lease. Cancelling the rollout makes the keeper
kill the agent; the stage must then end as `lease_lost` without asking the proxy for a flush:
its result is discarded anyway, and the flush retries for 20 s when the proxy is gone too, which
is what a stopping node or a stack's teardown looks like (a warm shutdown then waited for it).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.infra.db import unit_of_work
from polar_mq.infra.ports import free_port
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.cancel import cancel_where
from polar_mq.lifecycle.outbox import attach_publisher
from polar_mq.lifecycle.stages import Stage
from polar_mq.models import Rollout, RolloutStatus
from polar_mq.runtimes.host_exec import tagged_pids
from polar_mq.workers import runner
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.run_result import RunResult
from polar_mq.workers.stages import run_agent


@pytest.fixture()
def ctx(pg_url: str, tmp_path: Path) -> Iterator[WorkerContext]:
    settings = Settings(
        database_url=pg_url,
        runtime_root=tmp_path / "runtimes",
        unsafe_root_agents=True,  # below pytest's private tmp: the agent runs as this user
        lease_s=0.6,  # a heartbeat every 0.2 s
        proxy_port=free_port(),  # nothing listens there: the proxy is gone
        secret_key=f"lease-test-{uuid.uuid4().hex}",
    )
    context = WorkerContext(settings, lambda _messages: None)
    yield context
    context.session_factory.kw["bind"].dispose()


def _status(factory: sessionmaker[Session], rid: uuid.UUID) -> str:
    with factory() as session:
        return str(session.get_one(Rollout, rid).status)


def _prepared(ctx: WorkerContext, factory: sessionmaker[Session], command: str) -> uuid.UUID:
    """A rollout of a one-command agent, through the real prepare stage."""
    attach_publisher(factory, lambda _messages: None)
    spec = JobCreate.model_validate(
        {"tasks": [{"instruction": "x"}], "harness": {"type": "command", "command": command}}
    )
    with unit_of_work(factory) as session:
        rid = create_job(session, spec, ctx.settings.pool).rollout_ids[0]
    assert runner.run_stage(ctx, Stage.PREPARE, str(rid), "t1", attempt=1) == RunResult.done()
    return rid


def _run_agent_in_thread(
    ctx: WorkerContext, rid: uuid.UUID, outcome: list[RunResult]
) -> threading.Thread:
    def run() -> None:
        outcome.append(runner.run_stage(ctx, Stage.RUN_AGENT, str(rid), "t2", attempt=1))

    stage = threading.Thread(target=run)
    stage.start()
    return stage


def _wait(check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _cancel(factory: sessionmaker[Session], rid: uuid.UUID) -> None:
    with unit_of_work(factory) as session:
        assert cancel_where(session, Rollout.id == rid, "trainer")


def test_a_rollout_cancelled_under_its_agent_ends_the_stage_without_a_flush(
    ctx: WorkerContext,
    db_session_factory: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flushes: list[str] = []

    def flush(_ctx: WorkerContext, give_up: Callable[[], bool]) -> dict[str, Any]:
        flushes.append("flush")
        raise ConnectionError("the proxy is gone")

    monkeypatch.setattr(run_agent, "flush_proxy", flush)
    rid = _prepared(ctx, db_session_factory, "sleep 60")
    outcome: list[RunResult] = []
    stage = _run_agent_in_thread(ctx, rid, outcome)
    runtime_id = f"{rid.hex}-1"  # the rollout's runtime of attempt 1
    # the `sleep 60` agent, found by its runtime's tag
    _wait(lambda: bool(tagged_pids(runtime_id)), "the agent never started")
    _cancel(db_session_factory, rid)
    stage.join(30)
    assert not stage.is_alive(), "the stage still runs after its rollout was cancelled"
    assert outcome == [RunResult.lease_lost()]
    assert flushes == [], "a cancelled rollout's stage must not wait for the proxy"
    assert tagged_pids(runtime_id) == [], "the agent outlived its cancelled rollout"
    assert _status(db_session_factory, rid) == RolloutStatus.CANCELLED


def test_a_flush_waiting_for_a_gone_proxy_stops_once_the_rollout_is_cancelled(
    ctx: WorkerContext, db_session_factory: sessionmaker[Session]
) -> None:
    """The agent ended before the cancel was seen (say, its proxy went away first): the stage is
    retrying the flush against a closed port when the lease is lost, and stops retrying then."""
    rid = _prepared(ctx, db_session_factory, "exit 3")  # a failed agent: always flushed
    tries: list[float] = []
    real_post = ctx.http.post

    def post(url: str, **kwargs: Any) -> Any:
        tries.append(time.monotonic())
        return real_post(url, **kwargs)

    ctx.http.post = post  # type: ignore[method-assign]
    outcome: list[RunResult] = []
    stage = _run_agent_in_thread(ctx, rid, outcome)
    _wait(lambda: len(tries) >= 2, "the stage never flushed the proxy")
    _cancel(db_session_factory, rid)
    tries_at_cancel = len(tries)
    stage.join(30)
    assert not stage.is_alive()
    assert outcome == [RunResult.lease_lost()]
    # retried for 20 s before (about 9 tries); now one more at most once the keeper saw it
    assert len(tries) <= tries_at_cancel + 2, (tries_at_cancel, len(tries))
    assert _status(db_session_factory, rid) == RolloutStatus.CANCELLED
