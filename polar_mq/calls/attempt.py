"""One attempt's agent calls: the conditions, and the four reads the stages make of them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, Select, bindparam, func, select
from sqlalchemy.orm import Session

from polar_mq.calls.window import calls_window, window_start
from polar_mq.capability.tokens import AGENT
from polar_mq.infra.raw_sql import first_row
from polar_mq.models import LlmCall


@dataclass(frozen=True, slots=True)
class AttemptCalls:
    """Which calls: the rollout, its attempt, and when it was created (bounds the days read)."""

    rollout_id: uuid.UUID
    attempt: int
    created_at: datetime | None = None

    @classmethod
    def of(cls, rollout: Any) -> AttemptCalls:
        """The current attempt of a `Rollout` row (or anything with id, attempt, created_at)."""
        return cls(rollout.id, rollout.attempt, getattr(rollout, "created_at", None))

    def conditions(self) -> list[ColumnElement[bool]]:
        # `_trajectory_query` states the same conditions with bound parameters: keep in step
        return [
            LlmCall.rollout_id == self.rollout_id,
            LlmCall.attempt == self.attempt,  # never a lost attempt's calls
            LlmCall.purpose == AGENT,  # never a judge's calls
            *calls_window(self.created_at, None),
        ]


@dataclass(frozen=True, slots=True)
class CallSummary:
    """The attempt's agent calls as the proxy logged them."""

    calls: int
    last_status: int | None
    completion_tokens: int = 0
    """Completion tokens of those calls (what `max_tokens_per_rollout` bounds)."""
    last_response: dict[str, Any] | None = None
    """The last call's logged answer, read only when the engine refused it
    (`last_agent_answer`): the refusal's reason is there."""


def _bound_conditions(windowed: bool) -> list[ColumnElement[bool]]:
    """`AttemptCalls.conditions` with bound parameters (`w_rollout`, `w_attempt`, `w_since`),
    for statements built once."""
    conditions = [
        LlmCall.rollout_id == bindparam("w_rollout", type_=LlmCall.rollout_id.type),
        LlmCall.attempt == bindparam("w_attempt", type_=LlmCall.attempt.type),
        LlmCall.purpose == AGENT,
    ]
    if windowed:
        conditions.append(LlmCall.created_at >= bindparam("w_since", type_=LlmCall.created_at.type))
    return conditions


def _bound_params(which: AttemptCalls) -> dict[str, Any]:
    params: dict[str, Any] = {"w_rollout": which.rollout_id, "w_attempt": which.attempt}
    if which.created_at is not None:
        params["w_since"] = window_start(which.created_at)
    return params


def agent_calls(session: Session, which: AttemptCalls) -> list[LlmCall]:
    """Every agent call of the attempt, in call order (what a trajectory is built from)."""
    query = select(LlmCall).where(*which.conditions()).order_by(LlmCall.seq, LlmCall.created_at)
    return list(session.scalars(query).all())


_TRAJECTORY_COLUMNS = (
    LlmCall.seq, LlmCall.id, LlmCall.prompt_ids, LlmCall.completion_ids, LlmCall.logprobs,
    LlmCall.finish_reason, LlmCall.policy_version, LlmCall.status_code, LlmCall.engine_request,
    LlmCall.request, LlmCall.response, LlmCall.prompt_source, LlmCall.tito_fallback,
)  # fmt: skip


def _trajectory_query(windowed: bool) -> Select[Any]:
    """`AttemptCalls.conditions` with bound parameters, built once (see `agent_call_rows`)."""
    query = select(*_TRAJECTORY_COLUMNS).where(*_bound_conditions(windowed))
    return query.order_by(LlmCall.seq, LlmCall.created_at)


_TRAJECTORY_QUERIES = {windowed: _trajectory_query(windowed) for windowed in (False, True)}


def agent_call_rows(conn: Connection, which: AttemptCalls) -> Sequence[Row[Any]]:
    """`agent_calls` as plain rows of what a trajectory is built from, on a bare connection:
    the build stage reads them for every rollout, and ORM objects (every column, an identity
    map) and a query built per call cost more than the read itself."""
    return conn.execute(
        _TRAJECTORY_QUERIES[which.created_at is not None], _bound_params(which)
    ).all()


def last_agent_response(session: Session, which: AttemptCalls) -> dict[str, Any] | None:
    """The engine's answer to the attempt's last successful agent call (what the agent saw last)."""
    query = (
        select(LlmCall.response)
        .where(*which.conditions(), LlmCall.status_code == 200)
        .order_by(LlmCall.seq.desc())
        .limit(1)
    )
    response: dict[str, Any] | None = session.scalar(query)
    return response


def _summary_query(windowed: bool) -> Select[Any]:
    mine = _bound_conditions(windowed)
    last = (
        select(LlmCall.status_code).where(*mine).order_by(LlmCall.seq.desc()).limit(1)
    ).scalar_subquery()
    tokens = func.coalesce(func.sum(func.length(LlmCall.completion_ids)), 0)  # 4 bytes each
    return select(func.count(), last, tokens).select_from(LlmCall).where(*mine)


_SUMMARY_QUERIES = {windowed: _summary_query(windowed) for windowed in (False, True)}


def summarize(db: Session | Connection, which: AttemptCalls) -> CallSummary:
    """Count, last status and completion tokens of the attempt's agent calls, in one query.

    A statement built once, run on the driver's cursor (`raw_sql`): the run-agent stage asks
    this after every agent that made calls."""
    conn = db if isinstance(db, Connection) else db.connection()
    query = _SUMMARY_QUERIES[which.created_at is not None]
    row = first_row(conn, query, _bound_params(which))
    assert row is not None  # an aggregate always returns its row
    return CallSummary(int(row[0]), row[1], int(row[2] or 0) // 4)


def last_agent_answer(conn: Connection, which: AttemptCalls) -> dict[str, Any] | None:
    """What the proxy logged as the answer to the attempt's last agent call (an error document
    when it failed): the run-agent stage reads it only when the engine refused that call."""
    query = (
        select(LlmCall.response)
        .where(*which.conditions())
        .order_by(LlmCall.seq.desc())  # the last call, as `summarize` picks it
        .limit(1)
    )
    response: dict[str, Any] | None = conn.scalar(query)
    return response


def last_call_at(session: Session, which: AttemptCalls) -> datetime | None:
    """When the attempt's latest agent call was logged (the agent's last sign of life)."""
    latest: datetime | None = session.scalar(
        select(func.max(LlmCall.created_at)).where(*which.conditions())
    )
    return latest
