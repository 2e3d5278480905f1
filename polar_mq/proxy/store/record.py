"""One `llm_calls` row per proxied call, built on the request path as a plain dict.

The dict is all the request path produces: the writer thread turns batches of them into one
multi-row INSERT. Timings are measured from the moment the agent's body was read.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from polar_mq.capability.tokens import AGENT
from polar_mq.proxy.apis.base import TranslatedCall
from polar_mq.proxy.engines.vllm import Capture, View


@dataclass(slots=True)
class CallContext:
    """Everything known about a call before it is forwarded."""

    rollout_id: uuid.UUID
    seq: int
    api_type: str
    stream: bool
    request: dict[str, Any]
    model: str | None
    view: View
    started: float
    created_at: datetime
    purpose: str = AGENT
    """From the token: `judge` calls are logged but never become training samples."""
    backend: str = ""
    """Name of the backend that served the call (set when the pool routes it)."""
    policy_version: int = 0
    """That backend's policy version when the call was dispatched."""
    attempt: int = 1
    """The rollout attempt the token was issued for (1 for tokens without one)."""
    engine_api: str = ""
    """The engine-side API (`chat` for every translated family; else `api_type` itself)."""
    engine_request: dict[str, Any] | None = None
    """What was sent to the engine, kept only when it differs from `request` in kind (a family's
    request translated to chat) or in sampling (the job's policy changed the agent's values);
    other chat and completions calls store their request alone."""
    translated: TranslatedCall | None = None
    """How to answer in the agent's API family (None: the engine's own shape)."""
    prompt_source: str = "chat"
    """`tito` when the engine got token ids built by `polar_mq.proxy.tito`, else `chat`."""
    tito_fallback: str | None = None
    """Why token-in/token-out was not used for a call it could have served (None: not tried)."""
    stored_response: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """How `response` is stored from the engine's answer (a stream: its summary); None: as the
    engine sent it. TITO stores its completion in chat's form, as the chat path would."""
    adapt_answer: Callable[[dict[str, Any]], None] | None = None
    """Rewrites the engine's answer (or each stream event) in place before anything reads it:
    a TITO call to SGLang's native `/generate` is read as a completions answer from there on."""
    on_answered: Callable[[Capture, dict[str, Any]], Awaitable[None]] | None = None
    """Awaited with the capture and the answer (a stream: its summary) once the whole answer is
    known and before its end reaches the agent (TITO keeps the rollout's turn there, so the
    agent's next call finds it in any proxy process)."""


def new_call(
    rollout_id: uuid.UUID,
    seq: int,
    api_type: str,
    request: dict[str, Any],
    upstream_body: dict[str, Any],
    view: View,
    purpose: str = AGENT,
    attempt: int | None = None,
) -> CallContext:
    model = upstream_body.get("model")
    return CallContext(
        rollout_id=rollout_id,
        seq=seq,
        api_type=api_type,
        engine_api=api_type,
        stream=bool(upstream_body.get("stream")),
        request=request,
        model=model[:200] if isinstance(model, str) else None,
        view=view,
        started=time.perf_counter(),
        created_at=datetime.now(UTC),
        purpose=purpose,
        attempt=attempt or 1,
    )


_ID_BATCH = 256
_id_bytes = b""
_id_at = 0


def new_call_id() -> uuid.UUID:
    """A random (version 4) UUID, as `uuid.uuid4()`, from 4 KiB of `os.urandom` read at a time
    instead of one system call per call (uuid4's system call showed in the proxy's profile)."""
    global _id_bytes, _id_at
    if _id_at >= len(_id_bytes):
        _id_bytes, _id_at = os.urandom(16 * _ID_BATCH), 0
    at = _id_at
    _id_at = at + 16
    return uuid.UUID(bytes=_id_bytes[at : at + 16], version=4)


def _forget_ids() -> None:
    """A forked child must not hand out the ids its parent still holds."""
    global _id_bytes, _id_at
    _id_bytes, _id_at = b"", 0


os.register_at_fork(after_in_child=_forget_ids)


def call_row(
    call: CallContext,
    backend: str,
    *,
    status_code: int,
    complete: bool,
    response: dict[str, Any] | None,
    capture: Capture | None,
    first_token_at: float | None = None,
) -> dict[str, Any]:
    """The `llm_calls` row (column name -> value); the column types pack the token lists."""
    capture = capture or Capture()
    finish = capture.finish_reason
    return {
        "id": new_call_id(),
        "rollout_id": call.rollout_id,
        "seq": call.seq,
        "backend": backend,
        "model": call.model,
        "api_type": call.api_type,
        "stream": call.stream,
        "policy_version": call.policy_version,
        "status_code": status_code,
        "complete": complete,
        "request": call.request,
        "engine_request": call.engine_request,
        "response": response,
        "prompt_ids": capture.prompt_ids,
        "completion_ids": capture.completion_ids,
        "logprobs": capture.logprobs,
        "finish_reason": finish[:30] if isinstance(finish, str) else None,
        "latency_ms": (time.perf_counter() - call.started) * 1000.0,
        "ttft_ms": None if first_token_at is None else (first_token_at - call.started) * 1000.0,
        "created_at": call.created_at,
        "purpose": call.purpose,
        "attempt": call.attempt,
        "prompt_source": call.prompt_source,
        "tito_fallback": call.tito_fallback,
    }
