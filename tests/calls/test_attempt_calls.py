"""The `llm_calls` read contract on real PostgreSQL (partitioned by day): which calls are an
attempt's agent calls, and the four reads the stages make of them."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from polar_mq.calls import (
    AttemptCalls,
    agent_call_rows,
    agent_calls,
    last_agent_response,
    last_call_at,
    summarize,
)
from polar_mq.models import LlmCall
from polar_mq.models.base import utcnow


def _call(
    rollout_id: uuid.UUID,
    seq: int,
    *,
    attempt: int = 2,
    purpose: str = "agent",
    status: int = 200,
    at: datetime | None = None,
    text: str = "",
) -> LlmCall:
    response: dict[str, Any] = {"choices": [{"message": {"content": text}}]}
    return LlmCall(
        id=uuid.uuid4(), rollout_id=rollout_id, seq=seq, backend="b", model="m",
        api_type="chat", status_code=status, request={}, response=response,
        completion_ids=[1, 2, 3], latency_ms=1.0, purpose=purpose, attempt=attempt,
        created_at=at or utcnow(),
    )  # fmt: skip


def test_an_attempts_agent_calls_and_what_the_stages_read(
    db_session_factory: sessionmaker[Session],
) -> None:
    rollout, other = uuid.uuid4(), uuid.uuid4()
    created = utcnow() - timedelta(minutes=5)
    rows = [
        _call(rollout, 1, text="second"),
        _call(rollout, 0, text="first"),
        _call(rollout, 2, status=502, text="failed"),
        _call(rollout, 3, purpose="judge", text="a judge's reply"),
        _call(rollout, 0, attempt=1, text="a lost attempt"),
        _call(other, 0, text="another rollout"),
        # stamped three days before the rollout existed (a clock that is off): outside its window
        _call(rollout, 9, at=created - timedelta(days=3), text="outside"),
    ]
    with db_session_factory() as session:
        session.add_all(rows)
        session.commit()
    which = AttemptCalls(rollout, 2, created)
    with db_session_factory() as session:
        calls = agent_calls(session, which)
        assert [c.seq for c in calls] == [0, 1, 2]
        rows = agent_call_rows(session.connection(), which)  # the build stage's read
        assert [(r.seq, r.id, r.prompt_ids, r.response) for r in rows] == [
            (c.seq, c.id, c.prompt_ids, c.response) for c in calls
        ]
        answer = last_agent_response(session, which)
        assert answer is not None and answer["choices"][0]["message"]["content"] == "second"
        summary = summarize(session, which)
        assert (summary.calls, summary.last_status, summary.completion_tokens) == (3, 502, 9)
        latest = last_call_at(session, which)
        assert latest is not None and latest >= created
        unbounded = AttemptCalls(rollout, 2)  # no creation time: every day is read
        assert [c.seq for c in agent_calls(session, unbounded)] == [0, 1, 2, 9]
        assert [r.seq for r in agent_call_rows(session.connection(), unbounded)] == [0, 1, 2, 9]
        nothing = AttemptCalls(rollout, 3, created)
        assert agent_calls(session, nothing) == [] and last_agent_response(session, nothing) is None
        assert list(agent_call_rows(session.connection(), nothing)) == []
        assert summarize(session, nothing).calls == 0 and last_call_at(session, nothing) is None
