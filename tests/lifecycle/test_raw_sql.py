"""The transitions' statements on the driver's cursor (`raw_sql`): the same rows and parameters as
SQLAlchemy's path, and driver errors turned into SQLAlchemy's, a dropped connection invalidated."""

from __future__ import annotations

import uuid
from typing import Any, cast

import pytest
from sqlalchemy import Engine, Integer, Table, bindparam, literal, select, text
from sqlalchemy.exc import DataError, OperationalError

from polar_mq.lifecycle.raw_sql import first_row
from polar_mq.models import Event
from polar_mq.models.base import utcnow

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
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
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
