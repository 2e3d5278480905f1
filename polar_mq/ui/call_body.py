"""One LLM call's request or response as text, for the rollout page's lazily opened calls.

A rollout page lists every call but loads no request or response body: a long agent run makes
hundreds of calls whose prompts repeat the whole history. Each body is fetched when its row is
opened, as pretty JSON in `text/plain` (the page's script puts it in with `textContent`, so
HTML in a prompt or a reply is shown, never run), cut to BODY_CHARS.
"""

from __future__ import annotations

import uuid

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from polar_mq.calls.window import calls_window
from polar_mq.infra.errors import NotFound
from polar_mq.jobs.read_models import LlmCallRecord
from polar_mq.models import LlmCall, Rollout
from polar_mq.ui.reward_view import cut

PARTS = ("request", "engine_request", "response")
BODY_CHARS = 256 * 1024


def call_parts(call: LlmCallRecord) -> list[str]:
    """The bodies a call row offers (the translated engine request only when there is one)."""
    return [p for p in PARTS if p != "engine_request" or call.engine_request is not None]


def call_body(session: Session, rollout_id: uuid.UUID, call_id: uuid.UUID, part: str) -> str:
    """The part of the rollout's call as indented JSON, cut to BODY_CHARS. Raises NotFound."""
    if part not in PARTS:
        raise NotFound("call part", part)
    rollout = session.execute(
        select(Rollout.created_at, Rollout.finished_at).where(Rollout.id == rollout_id)
    ).one_or_none()
    if rollout is None:
        raise NotFound("rollout", rollout_id)
    column = getattr(LlmCall, part)
    body = session.execute(
        select(column).where(
            LlmCall.id == call_id,
            LlmCall.rollout_id == rollout_id,
            *calls_window(rollout.created_at, rollout.finished_at),
        )
    ).one_or_none()
    if body is None:
        raise NotFound("call", call_id)
    text = orjson.dumps(body[0], option=orjson.OPT_INDENT_2, default=str).decode()
    return cut(text, BODY_CHARS)
