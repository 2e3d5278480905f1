"""What every API family provides: its request as the engine's chat request, and back.

An API family (`apis.anthropic`, `apis.responses`, `apis.gemini`) lets an agent that speaks
another wire API than chat completions run unmodified while the proxy still captures the exact
token ids: the family turns the agent's request into a chat-completions request (`to_chat`), the
engine layer (`polar_mq.proxy.engines`) rewrites that for the inference server as it does for a
chat call (token ids, logprobs, served model), the backend pool sends it (stickiness, failover,
pause/drain, policy version), the capture reads ids and logprobs from the engine's chat answer,
and only then does the family turn that answer into its own shape (`render`, or a
`StreamTranslator` event by event). The family never sees how the engine was called, so a later
token-in/token-out engine mode slots in under every family unchanged.

Bad input is the family's to refuse (`FamilyError`, answered in the family's error shape by
`error_response`, never logged as a training call). Errors raised by the shared path (401, 413,
503 while paused, 502, an engine 4xx) are produced in OpenAI's shape and re-shaped by
`polar_mq.proxy.apis.route.reshape_error` using the family's `error_response`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.responses import Response

INVALID_REQUEST = "invalid_request"
AUTHENTICATION = "authentication"
PERMISSION = "permission"
NOT_FOUND = "not_found"
TOO_LARGE = "too_large"
RATE_LIMITED = "rate_limited"
UNAVAILABLE = "unavailable"
UPSTREAM = "upstream"
"""Error kinds the shared path raises; each family maps them to its own error types/statuses."""

KIND_OF_STATUS = {
    400: INVALID_REQUEST,
    401: AUTHENTICATION,
    403: PERMISSION,
    404: NOT_FOUND,
    413: TOO_LARGE,
    422: INVALID_REQUEST,
    429: RATE_LIMITED,
    503: UNAVAILABLE,
}


def kind_of_status(status: int) -> str:
    return KIND_OF_STATUS.get(status, INVALID_REQUEST if status < 500 else UPSTREAM)


class FamilyError(Exception):
    """The agent's request is not valid for its family: answered with `status` in its shape."""

    def __init__(self, message: str, status: int = 400, kind: str = INVALID_REQUEST) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind


@dataclass(slots=True)
class FamilyRequest:
    """What a family may need beyond the body: who calls, and what the URL said."""

    rollout_id: uuid.UUID
    path_params: dict[str, Any] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)
    responses: Any = None
    """The proxy's `ResponseStore` (OpenAI Responses' `previous_response_id`); None elsewhere."""


@dataclass(slots=True)
class Translation:
    """One call's chat request for the engine, and what the family keeps to answer it."""

    chat: dict[str, Any]
    """The chat-completions request (model = the agent's name; the engine layer rewrites it)."""
    stream: bool
    agent_model: str | None
    """The model name the agent used, restored in every answer."""
    context: dict[str, Any] = field(default_factory=dict)
    """Family-specific state (ids to reuse, the original items for a response record, ...)."""


class StreamTranslator(Protocol):
    """Turns the engine's chat chunks of one stream into the family's stream bytes, as they come.

    `chunk` receives every parsed chat chunk (already captured, not stripped) and returns the
    bytes to send now (possibly b""); `done` is called when the engine's `[DONE]` arrived and
    returns the closing events; `fail` when the engine broke off, with the message to report.
    """

    media_type: str

    def chunk(self, data: dict[str, Any]) -> bytes: ...

    def done(self) -> bytes: ...

    def fail(self, message: str) -> bytes: ...


class ApiFamily(Protocol):
    """The interface of a family module (modules satisfy protocols structurally)."""

    NAME: str
    """The `api_type` stored with each call (e.g. `anthropic_messages`)."""

    def to_chat(self, body: dict[str, Any], request: FamilyRequest) -> Translation:
        """The engine's chat request for `body`; raises `FamilyError` on bad input."""
        ...

    def render(self, data: dict[str, Any], translation: Translation) -> dict[str, Any]:
        """The family's non-streaming answer built from the engine's chat response `data`."""
        ...

    def stream(self, translation: Translation) -> StreamTranslator: ...

    def error_response(self, status: int, kind: str, message: str) -> Response:
        """An error in the family's shape (status as given)."""
        ...


def sse_event(name: str | None, payload: bytes) -> bytes:
    """One server-sent event: optional `event:` line, one `data:` line, blank line."""
    head = b"event: " + name.encode() + b"\n" if name else b""
    return head + b"data: " + payload + b"\n\n"


def reasoning_of(message: dict[str, Any]) -> str | None:
    """The engine's reasoning text of a message or delta (`reasoning`; older vLLM: `_content`)."""
    value = message.get("reasoning")
    if value is None:
        value = message.get("reasoning_content")
    return value if isinstance(value, str) else None


FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_TOOL_CALLS = "tool_calls"


@dataclass(frozen=True, slots=True)
class TranslatedCall:
    """A call that came in through a family: how to answer it once the engine has."""

    family: ApiFamily
    translation: Translation
