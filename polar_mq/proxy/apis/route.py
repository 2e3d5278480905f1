"""The one hot path every API family shares: authenticate, translate, forward, capture, answer.

A family's route is `family_endpoint(module)`: the agent's body is turned into the engine's chat
request by the family, rewritten by the engine layer exactly as a chat call, sent through the
backend pool and captured by `polar_mq.proxy.capture` (the job's sampling policy is enforced on the
chat request first, `polar_mq.proxy.sampling`); the stored call keeps the family's name
(`api_type`), the agent's original request and the engine request it became
(`engine_request`), and the engine's response with its token ids. Errors produced on the shared
path (OpenAI-shaped) are re-shaped into the family's error format here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from polar_mq.proxy.apis.base import (
    UPSTREAM,
    ApiFamily,
    FamilyError,
    FamilyRequest,
    TranslatedCall,
    kind_of_status,
)
from polar_mq.proxy.backends import BackendUnavailable
from polar_mq.proxy.capture import forward_json, forward_stream
from polar_mq.proxy.engines.base import CHAT
from polar_mq.proxy.rollout_states import Refusal
from polar_mq.proxy.sampling import enforce
from polar_mq.proxy.server.abort import unless_client_leaves
from polar_mq.proxy.server.body import read_json_object
from polar_mq.proxy.server.gate import admit, kind_of
from polar_mq.proxy.server.state import ProxyState
from polar_mq.proxy.store.receipts import number_call
from polar_mq.proxy.store.record import new_call
from polar_mq.proxy.token_budget import within_budget

CHAT_PATH = "/v1/chat/completions"
KEPT_HEADERS = ("retry-after", "connection")
ERROR_MESSAGE_MAX = 2000

Handler = Callable[[Request], Awaitable[Response]]


def error_message(response: Response) -> str:
    """The message of an OpenAI-shaped (or any) error response body."""
    raw = bytes(response.body) if getattr(response, "body", None) else b""
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str):
            return message
        if isinstance(error, str):
            return error
        if isinstance(data.get("message"), str):
            return str(data["message"])
        if isinstance(data.get("detail"), str):
            return str(data["detail"])
    text = raw.decode("utf-8", "replace").strip()
    return text[:ERROR_MESSAGE_MAX] or f"request failed with status {response.status_code}"


def reshape_error(response: Response, family: ApiFamily) -> Response:
    """An error response of the shared path (or the engine's) in the family's shape."""
    if response.status_code < 400 or not getattr(response, "body", b""):
        return response  # a success, or a 499 with no body (nobody is listening)
    status = response.status_code
    out = family.error_response(status, kind_of_status(status), error_message(response))
    for name in KEPT_HEADERS:
        if name in response.headers:
            out.headers[name] = response.headers[name]
    return out


async def forward_family(request: Request, family: ApiFamily) -> Response:
    """The family's whole hot path (the chat route's, with a translation on each side)."""
    state: ProxyState = request.app.state.proxy
    claim = await admit(request)
    if isinstance(claim, Refusal):
        refusal = family.error_response(claim.status, kind_of(claim), claim.message)
        return state.metrics.refused(family.NAME, refusal)
    body = await read_json_object(request, state.max_body_bytes, state.body_read_timeout_s)
    if isinstance(body, Response):
        return state.metrics.refused(family.NAME, reshape_error(body, family))
    asked = FamilyRequest(
        rollout_id=claim.rollout_id,
        path_params=dict(request.path_params),
        query=dict(request.query_params),
        responses=state.responses,
    )
    try:
        translation = family.to_chat(body, asked)
    except FamilyError as exc:
        refusal = family.error_response(exc.status, exc.kind, exc.message)
        return state.metrics.refused(family.NAME, refusal)
    enforced = enforce(claim.sampling, translation.chat)  # the job's sampling policy
    chat = await within_budget(
        state.budgets, claim, translation.chat if enforced is None else enforced[0]
    )
    if isinstance(chat, Refusal):
        refusal = family.error_response(chat.status, kind_of_status(chat.status), chat.message)
        return state.metrics.refused(family.NAME, refusal)
    upstream_body, view = state.engine.rewrite_request(CHAT, chat, state.served_model)
    try:
        seq = await number_call(state.seqs, state.receipts, claim)
    except BackendUnavailable as exc:  # a call counter is unreachable: retryable 503
        return state.metrics.refused(family.NAME, reshape_error(exc.response(), family))
    call = new_call(
        claim.rollout_id, seq, family.NAME, body, upstream_body, view, claim.purpose, claim.attempt
    )
    call.engine_api = CHAT
    call.engine_request = upstream_body
    call.translated = TranslatedCall(family, translation)
    path = CHAT_PATH
    if state.tito is not None and not claim.chat_only:  # TITO when the turn extends the last
        token_prompt = await state.tito.route(state.backends, call, upstream_body)
        if token_prompt is not None:
            path, upstream_body = token_prompt.path, token_prompt.body
    if call.stream:
        response = await forward_stream(state, call, path, upstream_body)
    else:
        forward = forward_json(state, call, path, upstream_body)
        response = await unless_client_leaves(state, call, request.receive, forward)
    return reshape_error(response, family)


def family_endpoint(family: ApiFamily) -> Handler:
    async def endpoint(request: Request) -> Response:
        return await forward_family(request, family)

    endpoint.__name__ = f"{family.NAME}_endpoint"
    return endpoint


async def count_prompt_tokens(
    state: ProxyState, chat: dict[str, Any], agent_model: str | None = None
) -> int:
    """The prompt length of a translated chat request by the engine's own tokenizer and template.

    For the families' token-counting routes: nothing is generated, so nothing is logged; the
    first backend answers (all serve the same model). Raises `FamilyError` when the engine cannot
    be reached or does not count.
    """
    asked: dict[str, Any] = {"messages": chat["messages"], "add_generation_prompt": True}
    if "tools" in chat:
        asked["tools"] = chat["tools"]
    model = state.served_model or agent_model
    if model is not None:
        asked["model"] = model
    try:
        upstream = await state.backends.primary.post_small("/tokenize", orjson.dumps(asked))
    except Exception as exc:  # httpx errors: the agent only needs to know it failed
        message = f"upstream inference server unavailable ({type(exc).__name__})"
        raise FamilyError(message, 502, UPSTREAM) from exc
    if upstream.status_code != 200:
        raw = Response(upstream.content, upstream.status_code)
        status = upstream.status_code
        raise FamilyError(error_message(raw), status, kind_of_status(status))
    try:
        count = orjson.loads(upstream.content).get("count")
    except (orjson.JSONDecodeError, AttributeError):
        count = None
    if not isinstance(count, int):
        raise FamilyError("the engine's /tokenize gave no token count", 502, UPSTREAM)
    return count


__all__ = [
    "FamilyError",
    "count_prompt_tokens",
    "error_message",
    "family_endpoint",
    "forward_family",
    "reshape_error",
]
