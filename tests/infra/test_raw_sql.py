"""The transitions' statements on the driver's cursor (`raw_sql`): the same rows and parameters as
SQLAlchemy's path, and driver errors turned into SQLAlchemy's, a dropped connection invalidated."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any, cast

import pytest
from sqlalchemy import Connection, Engine, Integer, Table, bindparam, literal, select, text
from sqlalchemy.exc import DataError, OperationalError
from sqlalchemy.orm import Session

from polar_mq.calls import attempt
from polar_mq.calls.attempt import AttemptCalls, summarize
from polar_mq.infra.db import create_db_engine, make_session_factory, unit_of_work
from polar_mq.infra.migrate import upgrade
from polar_mq.infra.raw_sql import first_row
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.service import create_job
from polar_mq.lifecycle import transitions
from polar_mq.lifecycle.stages import STAGE_STATES, Stage
from polar_mq.lifecycle.transitions import (
    Claimed,
    claim,
    fail,
    finish,
    finish_in_one,
    runtime_released,
)
from polar_mq.models import Event, Rollout, TrajectorySample
from polar_mq.models.base import utcnow
from polar_mq.workers.stages.outcomes import SAMPLES

EVENTS = cast(Table, Event.__table__)
STATEMENT = select(
    bindparam("b_id", type_=EVENTS.c.rollout_id.type),
    bindparam("b_at", type_=EVENTS.c.at.type),
    bindparam("b_detail", type_=EVENTS.c.detail.type),
    bindparam("b_n", type_=Integer) + 1,
    literal("constant"),
)
FAILING = select(bindparam("b_n", type_=Integer) / 0)


def test_rows_and_parameters_match_sqlalchemys(pg_engine: Engine) -> None:
    params: dict[str, Any] = {
        "b_id": uuid.uuid4(),
        "b_at": utcnow(),
        "b_detail": {"reason": "nul \x00 kept", "n": [1, 2]},  # through the engine's serializer
        "b_n": 41,
    }
    with pg_engine.connect() as conn:
        expected = tuple(conn.execute(STATEMENT, params).one())
        assert first_row(conn, STATEMENT, params) == expected
        assert first_row(conn, STATEMENT, params) == expected  # the compiled form, reused
    assert expected[0] == params["b_id"] and expected[3] == 42 and expected[4] == "constant"
    assert expected[2] == params["b_detail"]


def test_a_driver_error_is_sqlalchemys_and_the_transaction_rolls_back(pg_engine: Engine) -> None:
    with pg_engine.connect() as conn:
        with pytest.raises(DataError):  # division by zero
            first_row(conn, FAILING, {"b_n": 1})
        conn.rollback()
        assert first_row(conn, STATEMENT, _params()) is not None


def test_a_dropped_connection_is_an_operational_error_and_invalidated(pg_engine: Engine) -> None:
    with pg_engine.connect() as conn:
        pid: int = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with pg_engine.connect() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            other.commit()
        with pytest.raises(OperationalError) as raised:
            first_row(conn, STATEMENT, _params())
        assert raised.value.connection_invalidated
        assert conn.invalidated
    with pg_engine.connect() as fresh:  # the pool hands out a working connection again
        assert first_row(fresh, STATEMENT, _params()) is not None


def _params() -> dict[str, Any]:
    return {"b_id": uuid.uuid4(), "b_at": utcnow(), "b_detail": {}, "b_n": 1}


# Every statement the transitions and the call reads hand to `first_row`, run both ways.


@pytest.fixture(scope="module")
def sqlite_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path_factory.mktemp('raw_sql') / 'polar.db'}"
    upgrade(url)
    engine = create_db_engine(url)
    yield engine
    engine.dispose()


@pytest.fixture(params=["postgresql", "sqlite"])
def any_engine(request: pytest.FixtureRequest) -> Engine:
    name = "pg_engine" if request.param == "postgresql" else "sqlite_engine"
    return cast(Engine, request.getfixturevalue(name))


SNAPSHOT = [cast(Table, t.__table__) for t in (Rollout, Event, TrajectorySample)]
"""The tables a transition writes (rows of one rollout); autoincrement ids left out."""


def _effects(conn: Connection, rollout_id: uuid.UUID) -> dict[str, list[tuple[Any, ...]]]:
    seen: dict[str, list[tuple[Any, ...]]] = {}
    for table in SNAPSHOT:
        columns = [c for c in table.c if not (c.name == "id" and c.autoincrement is True)]
        key = table.c.id if table.name == "rollouts" else table.c.rollout_id
        rows = conn.execute(select(*columns).where(key == rollout_id)).all()
        seen[table.name] = sorted((tuple(row) for row in rows), key=repr)
    return seen


class BothWays:
    """Stands in for `first_row`: runs each statement first through SQLAlchemy's own execution
    (in a savepoint, rolled back), then through `first_row`, and checks that both return the same
    row and leave the same rows behind."""

    def __init__(self, rollout_id: uuid.UUID) -> None:
        self.rollout_id = rollout_id
        self.statements: list[Any] = []

    def __call__(
        self, conn: Connection, statement: Any, params: Mapping[str, Any]
    ) -> tuple[Any, ...] | None:
        self.statements.append(statement)
        if not conn.in_transaction():
            conn.begin()
        with conn.begin_nested() as savepoint:
            result = conn.execute(statement, dict(params))
            row = result.first() if result.returns_rows else None
            plain = (None if row is None else tuple(row), _effects(conn, self.rollout_id))
            savepoint.rollback()
        raw = first_row(conn, statement, params)
        assert (raw, _effects(conn, self.rollout_id)) == plain, statement
        return raw


def _life_of_a_rollout(engine: Engine, checker: BothWays, rid: uuid.UUID) -> None:
    """Claims of every stage, a skipped claim, finishes with and without rows, a failure, a
    runtime event and the call summary: every shape of statement sent to `first_row`."""
    factory = make_session_factory(engine)
    owner = "w1"
    for stage in (Stage.PREPARE, Stage.RUN_AGENT, Stage.BUILD, Stage.EVALUATE):
        with unit_of_work(factory) as session:
            won = claim(session, stage, rid, owner, 60, attempt=1)
            assert isinstance(won, Claimed)
            assert claim(session, stage, rid, "w2", 60) == STAGE_STATES[stage][1]  # skipped
            runtime_released(session, won, {"recycled": True})
        if stage is Stage.BUILD:
            rows = {SAMPLES: [_sample(won, 0), _sample(won, 1)]}
            with engine.connect() as conn:
                if not finish_in_one(conn, won, {"n_llm_calls": 2}, rows, {"samples": 2}):
                    finish(Session(bind=conn), won, {"n_llm_calls": 2}, rows, {}, None)
                conn.commit()
        elif stage is Stage.EVALUATE:
            with unit_of_work(factory) as session:
                fail(session, won, "runtime_error", "disk full")
        else:
            with unit_of_work(factory) as session:
                finish(session, won, {"node": "n1"}, {}, {"ok": True}, None)
    with engine.connect() as conn:
        for created in (None, utcnow()):
            summarize(conn, AttemptCalls(rid, 1, created))


def _sample(claimed: Claimed, index: int) -> dict[str, Any]:
    return {
        "rollout_id": claimed.rollout.id, "attempt": claimed.rollout.attempt,
        "sample_index": index, "builder": "per_call", "prompt_ids": [1, index],
        "response_ids": [3], "loss_mask": [1], "logprobs": None, "messages": None,
        "metadata": {"i": index}, "created_at": utcnow(),
    }  # fmt: skip


def test_every_statement_gives_the_rows_sqlalchemy_gives(
    any_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    with unit_of_work(make_session_factory(any_engine)) as session:
        job = create_job(session, JobCreate.model_validate({"tasks": [{"instruction": "x"}]}), "p")
    rid = job.rollout_ids[0]
    checker = BothWays(rid)
    monkeypatch.setattr(transitions, "first_row", checker)
    monkeypatch.setattr(attempt, "first_row", checker)
    _life_of_a_rollout(any_engine, checker, rid)
    seen = {id(s) for s in checker.statements}
    ordinary = {id(transitions._INSERT_EVENT)} | {id(q) for q in attempt._SUMMARY_QUERIES.values()}
    assert ordinary <= seen
    if any_engine.dialect.name == "postgresql":  # the fused ones, on the driver's cursor
        assert any_engine.dialect.driver == "psycopg"
        assert {id(s) for s in transitions._CLAIM_FUSED.values()} <= seen
        with_rows = [s for s in checker.statements if "rows_trajectory_samples" in str(s)]
        assert with_rows, "no finish carried its rows in the statement"
    with any_engine.connect() as conn:
        kinds = conn.scalars(select(Event.kind).where(Event.rollout_id == rid)).all()
    assert sorted(set(kinds)) == ["failed", "finished", "runtime_released", "skipped", "started",
                                  "submitted"]  # fmt: skip


def test_a_parameter_only_sqlalchemy_can_expand_is_refused(pg_engine: Engine) -> None:
    """An IN list is rewritten per execution by SQLAlchemy: the cursor path says so instead of
    sending SQL with an unexpanded parameter."""
    expanding = select(EVENTS.c.id).where(EVENTS.c.id.in_(bindparam("b_ids", expanding=True)))
    with pg_engine.connect() as conn, pytest.raises(ValueError, match="expanding"):
        first_row(conn, expanding, {"b_ids": [1, 2]})
