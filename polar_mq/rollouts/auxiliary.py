"""Marking a finished agent's side calls `auxiliary`, so they never become samples or answers.

Runs once the proxy has flushed the attempt's calls, before the stage's finish commits; re-running
it gives the same marks, so a retried stage is harmless. Only what the rules look at is read: the
system and last user messages, the token budget, whether tools were offered.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import cast, func, literal, select, update
from sqlalchemy.dialects.postgresql import JSONPATH
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.db import unit_of_work
from polar_mq.harnesses.auxiliary import AuxiliaryRule, is_auxiliary
from polar_mq.models import LlmCall
from polar_mq.tokens import AGENT

AUXILIARY = "auxiliary"
_PROMPT_MESSAGES = '$[*] ? (@.role == "system" || @.role == "developer" || @.role == "user")'


def _shape(
    messages: list[Any] | None, max_tokens: Any, max_completion: Any, has_tools: bool
) -> dict[str, Any]:
    """The chat request as far as the rules look at it (tools as a one-element stand-in)."""
    return {
        "messages": messages or [],
        "max_tokens": max_tokens,
        "max_completion_tokens": max_completion,
        "tools": [{}] if has_tools else None,
    }


def mark_auxiliary_calls(
    session_factory: sessionmaker[Session],
    rollout_id: uuid.UUID,
    attempt: int,
    rules: Sequence[AuxiliaryRule],
) -> int:
    """Set purpose `auxiliary` on the attempt's agent calls that a rule matches; how many."""
    if not rules:
        return 0
    request = func.coalesce(LlmCall.engine_request, LlmCall.request)
    query = select(
        LlmCall.id,
        func.jsonb_path_query_array(request["messages"], cast(literal(_PROMPT_MESSAGES), JSONPATH)),
        request["max_tokens"],
        request["max_completion_tokens"],
        func.coalesce(func.jsonb_typeof(request["tools"]) == "array", False),
    ).where(
        LlmCall.rollout_id == rollout_id,
        LlmCall.attempt == attempt,
        LlmCall.purpose == AGENT,
    )
    with unit_of_work(session_factory) as session:
        side = [row[0] for row in session.execute(query) if is_auxiliary(_shape(*row[1:]), rules)]
        if side:
            session.execute(update(LlmCall).where(LlmCall.id.in_(side)).values(purpose=AUXILIARY))
    return len(side)
