"""The proxy's own database connections run their one-statement work in autocommit on PostgreSQL:
its reads (policy state, rollout states, token budgets) and its call writer's batch INSERT, with
no BEGIN before them and no ROLLBACK or COMMIT after (round trips on every new rollout's first
call and on every batch)."""

from __future__ import annotations

import uuid

from psycopg.pq import TransactionStatus
from sqlalchemy import Engine, func, select

from polar_mq.models import LlmCall
from polar_mq.proxy.rollout_states import db_state_reader
from polar_mq.proxy.server.app import _reads_engine
from polar_mq.proxy.store.call_insert import CallInserter
from polar_mq.proxy.store.writer_engine import create_writer_engine
from tests.proxy.test_proxy_writer import call_row


def _no_transaction_after_a_statement(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
        raw = conn.connection.dbapi_connection
        assert raw is not None
        assert raw.info.transaction_status == TransactionStatus.IDLE  # no BEGIN was sent


def test_the_proxy_reads_in_autocommit(pg_url: str) -> None:
    engine = _reads_engine(pg_url)
    try:
        _no_transaction_after_a_statement(engine)
        assert db_state_reader(engine)([uuid.uuid4()]) == {}  # an unknown rollout: no row
    finally:
        engine.dispose()


def test_the_call_writer_inserts_a_batch_in_autocommit(pg_url: str) -> None:
    engine = create_writer_engine(pg_url)
    try:
        _no_transaction_after_a_statement(engine)
        rollout = uuid.uuid4()
        with engine.begin() as conn:  # what CallStore does: a no-op transaction around it
            CallInserter(engine).insert(conn, [call_row(seq, rollout_id=rollout) for seq in (1, 2)])
        with engine.connect() as conn:
            stored = conn.scalar(
                select(func.count()).select_from(LlmCall).where(LlmCall.rollout_id == rollout)
            )
        assert stored == 2
    finally:
        engine.dispose()
