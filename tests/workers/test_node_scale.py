"""What lets one node hold a thousand live sessions (docs/multihost.md, "Live sessions").

- Its open-file limit: each live session holds five descriptors in the run-agent worker; the
  node raises its soft limit to what its concurrency needs, or refuses to start.
- Its database pools: a burst of sessions starting or ending queues for the stage pool (bounded,
  whatever the concurrency); the lease keeper renews the live sessions' leases on a connection
  of its own, and a stage waits for the pool rather than fail the session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from sqlalchemy import event, select, update
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.config import Settings
from polar_mq.infra.db import unit_of_work
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle.stages import Stage
from polar_mq.lifecycle.transitions import Claimed, claim
from polar_mq.models import Rollout, RolloutStatus
from polar_mq.workers.context import POOL_WAIT_S, WorkerContext
from polar_mq.workers.open_files import BASE_FDS, FDS_PER_TASK
from tests.workers.test_leases import _claimed

SESSIONS = 200
ENSURE = "from polar_mq.workers.open_files import ensure; print(ensure([128]))"


def _under_limit(soft: int, hard: int, *argv: str) -> tuple[int, str, str]:
    """Run `python argv` with these open-file limits; its process group is killed after 60 s
    (a worker that did not refuse to start would otherwise start its stage workers)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_MQ_")}
    proc = subprocess.Popen(
        ["prlimit", f"--nofile={soft}:{hard}", "--", sys.executable, *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return proc.returncode, out, err


def test_the_soft_open_file_limit_is_raised_to_what_the_concurrency_needs() -> None:
    code, out, err = _under_limit(64, 20000, "-c", ENSURE)
    assert code == 0, err
    assert int(out) == BASE_FDS + FDS_PER_TASK * 128


def test_a_hard_limit_below_the_concurrency_is_refused_with_its_fix() -> None:
    code, _, err = _under_limit(64, 512, "-c", ENSURE)
    assert code == 1 and "ValueError" in err and "ulimit -n" in err


def test_polar_mq_worker_refuses_a_concurrency_its_limit_cannot_hold() -> None:
    code, out, err = _under_limit(
        64, 512, "-m", "polar_mq.cli", "worker", "--concurrency", "run_agent=1024",
        "--no-janitor", "--no-warm-pool",
    )  # fmt: skip
    assert code == 2, out + err
    assert "open-file limit is 512" in out + err


@pytest.fixture()
def ctx(pg_url: str) -> Iterator[WorkerContext]:
    context = WorkerContext(Settings(database_url=pg_url), lambda _messages: None)
    yield context
    context._engine.dispose()
    context._lease_engine.dispose()


def test_leases_are_renewed_while_the_stage_pool_is_exhausted(
    ctx: WorkerContext, db_session_factory: sessionmaker[Session]
) -> None:
    """Every connection of the stage pool taken (a burst of sessions ending): the keeper's
    renewal goes through at once, not after the pool's wait."""
    claimed = _claimed(db_session_factory)
    with db_session_factory() as session:
        before = session.get_one(Rollout, claimed.rollout.id).lease_expires_at
    with ExitStack() as taken, ctx.leases.hold(claimed) as held:
        engine = ctx.autocommit_engine
        for _ in range(engine.pool.size() + engine.pool._max_overflow):  # type: ignore[attr-defined]
            taken.enter_context(engine.connect())
        renewal = threading.Thread(target=ctx.leases.renew, args=([held],), daemon=True)
        renewal.start()
        renewal.join(timeout=10)
        assert not renewal.is_alive(), "the renewal queued behind the stages' pool"
    with db_session_factory() as session:
        assert session.get_one(Rollout, claimed.rollout.id).lease_expires_at > before
    assert not held.lost.is_set()


def test_a_stage_waits_for_its_pool_rather_than_fail_the_session(ctx: WorkerContext) -> None:
    pool = ctx.autocommit_engine.pool
    assert pool.timeout() == POOL_WAIT_S >= 10 * ctx.settings.lease_s  # type: ignore[attr-defined]
    assert pool.size() + pool._max_overflow == 12  # type: ignore[attr-defined]  # not per session


def test_a_keeper_renews_every_lease_of_its_process_in_one_statement(
    ctx: WorkerContext, db_session_factory: sessionmaker[Session]
) -> None:
    """A thousand live sessions: their renewal is one UPDATE, not one per session, and it
    fences each lease as the single renewal does (a cancelled one is reported lost)."""
    with unit_of_work(db_session_factory) as session:
        spec = {"tasks": [{"instruction": f"t{i}"} for i in range(SESSIONS)]}
        job = create_job(session, JobCreate.model_validate(spec), "p")
    claims = []
    with unit_of_work(db_session_factory) as session:
        for rid in job.rollout_ids:
            won = claim(session, Stage.PREPARE, rid, f"w/{rid}", 60)
            assert isinstance(won, Claimed)
            claims.append(won)
    lost: list[uuid.UUID] = []
    statements: list[str] = []
    engine = ctx._lease_engine
    count = lambda *args: statements.append(args[2])  # noqa: E731  # (conn, cursor, statement, …)
    event.listen(engine, "before_cursor_execute", count)
    try:
        with ExitStack() as holds:
            held = [
                holds.enter_context(ctx.leases.hold(c, lambda c=c: lost.append(c.rollout.id)))
                for c in claims
            ]
            with unit_of_work(db_session_factory) as session:
                session.execute(
                    update(Rollout)
                    .where(Rollout.id == claims[0].rollout.id)
                    .values(status=RolloutStatus.CANCELLED)
                )
            ctx.leases.renew(held)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert sum("UPDATE rollouts" in s for s in statements) == 1
    assert lost == [claims[0].rollout.id]
    with db_session_factory() as session:
        expiries = session.scalars(
            select(Rollout.lease_expires_at).where(Rollout.id.in_(job.rollout_ids[1:]))
        ).all()
    assert len(expiries) == SESSIONS - 1 and all(e is not None for e in expiries)
