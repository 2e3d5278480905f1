"""The run-agent stage's marking of side calls on real PostgreSQL: which stored calls the rules
see as auxiliary, and that only the attempt's agent calls are touched."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.harnesses.auxiliary import AuxiliaryRule
from polar_mq.harnesses.auxiliary.marking import AUXILIARY, mark_auxiliary_calls
from polar_mq.models import LlmCall
from polar_mq.models.base import utcnow

RULES = (
    AuxiliaryRule(system_contains="a title"),
    AuxiliaryRule(max_tokens_at_most=32, no_tools=True),
)


def _chat(system: str, *, tools: bool = False, max_tokens: int | None = None) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "go"}]
    return {
        "messages": messages,
        **({"tools": [{"type": "function", "function": {"name": "bash"}}]} if tools else {}),
        **({"max_tokens": max_tokens} if max_tokens is not None else {}),
    }


def _call(
    rollout_id: uuid.UUID,
    seq: int,
    engine_request: dict[str, Any],
    request: dict[str, Any] | None = None,
    *,
    attempt: int = 2,
    purpose: str = "agent",
) -> LlmCall:
    return LlmCall(
        id=uuid.uuid4(), rollout_id=rollout_id, seq=seq, backend="b", model="m",
        api_type="chat", status_code=200, request=request or {}, engine_request=engine_request,
        response={}, completion_ids=[1], latency_ms=1.0, purpose=purpose, attempt=attempt,
        created_at=utcnow(),
    )  # fmt: skip


def test_the_attempts_side_calls_are_marked_and_nothing_else(
    db_session_factory: sessionmaker[Session],
) -> None:
    rollout = uuid.uuid4()
    title = _chat("Write a title for this chat")
    calls = {
        "title": _call(rollout, 0, title),
        "main loop": _call(rollout, 1, _chat("You are a coding agent", tools=True), {}),
        # the job's sampling clamped the engine's budget; the agent itself asked for a lot
        "clamped": _call(rollout, 2, _chat("plan", max_tokens=16), {"max_tokens": 4096}),
        # a Gemini agent's own budget field, no tools offered
        "small": _call(rollout, 3, _chat("count"), {"generationConfig": {"maxOutputTokens": 8}}),
        "a judge's": _call(rollout, 4, title, purpose="judge"),
        "a lost attempt's": _call(rollout, 5, title, attempt=1),
        "another rollout's": _call(uuid.uuid4(), 0, title),
    }
    with db_session_factory() as session:
        session.add_all(calls.values())
        session.commit()

    assert mark_auxiliary_calls(db_session_factory, rollout, 2, ()) == 0  # no rules: no read
    assert mark_auxiliary_calls(db_session_factory, rollout, 2, RULES) == 2
    assert mark_auxiliary_calls(db_session_factory, rollout, 2, RULES) == 0  # a retried stage

    with db_session_factory() as session:
        ids = [c.id for c in calls.values()]
        purpose = dict(session.execute(select(LlmCall.id, LlmCall.purpose).where(_in(ids))).all())
    marked = sorted(name for name, call in calls.items() if purpose[call.id] == AUXILIARY)
    assert marked == ["small", "title"]
    assert purpose[calls["a judge's"].id] == "judge"


def _in(ids: list[uuid.UUID]) -> Any:
    return LlmCall.id.in_(ids)
