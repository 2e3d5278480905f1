"""Marking a finished agent's side calls `auxiliary`, so they never become samples or answers.

Runs once the proxy has flushed the attempt's calls, before the stage's finish commits; re-running
it gives the same marks, so a retried stage is harmless. Only what the rules look at is read: the
system and last user messages and whether tools were offered (from the chat request the engine
got), and the token budget the agent itself asked for (in its own API family's field: the job's
sampling may have clamped the engine's, which would make every call look small).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import cast, func, literal, select, update
from sqlalchemy.dialects.postgresql import JSONPATH
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.capability.tokens import AGENT
from polar_mq.harnesses.auxiliary.rules import AuxiliaryRule, is_auxiliary
from polar_mq.infra.db import unit_of_work
from polar_mq.models import LlmCall

AUXILIARY = "auxiliary"
_PROMPT_MESSAGES = '$[*] ? (@.role == "system" || @.role == "developer" || @.role == "user")'


def _shape(messages: list[Any] | None, max_tokens: Any, has_tools: bool) -> dict[str, Any]:
    """The chat request as far as the rules look at it (tools as a one-element stand-in)."""
    return {
        "messages": messages or [],
        "max_tokens": max_tokens,
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
    chat = func.coalesce(LlmCall.engine_request, LlmCall.request)
    sent = LlmCall.request  # the budget the agent asked for, before the job's sampling applied
    asked = func.coalesce(
        sent["max_tokens"],
        sent["max_completion_tokens"],
        sent["max_output_tokens"],
        sent["generationConfig"]["maxOutputTokens"],
    )
    query = select(
        LlmCall.id,
        func.jsonb_path_query_array(chat["messages"], cast(literal(_PROMPT_MESSAGES), JSONPATH)),
        asked,
        func.coalesce(func.jsonb_typeof(chat["tools"]) == "array", False),
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
