"""Route handlers: authenticate, read the body, rewrite for the engine, forward and capture."""

from __future__ import annotations

import os

import orjson
from starlette.requests import Request
from starlette.responses import Response

from polar_mq.proxy.backends import BackendUnavailable
from polar_mq.proxy.capture import forward_json, forward_stream
from polar_mq.proxy.engines.base import CHAT, COMPLETIONS
from polar_mq.proxy.errors import bad_gateway, unauthorized
from polar_mq.proxy.rollout_states import Refusal
from polar_mq.proxy.sampling import enforce
from polar_mq.proxy.server.abort import unless_client_leaves
from polar_mq.proxy.server.auth import admin_allowed
from polar_mq.proxy.server.body import read_json_object
from polar_mq.proxy.server.gate import admit, openai_refusal
from polar_mq.proxy.server.state import ProxyState
from polar_mq.proxy.store.receipts import number_call
from polar_mq.proxy.store.record import new_call
from polar_mq.proxy.store.writer import CallsNotStored
from polar_mq.proxy.token_budget import within_budget

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
GENERATE_PATH = "/generate"
FORWARDED_PATHS = (CHAT_PATH, COMPLETIONS_PATH, GENERATE_PATH)
"""Upstream paths the backends' pools post to (`/generate`: SGLang's, for TITO calls only)."""


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json")


async def _generate(request: Request, api_type: str, path: str) -> Response:
    """Authenticate, read, rewrite, forward: the proxy's whole hot path."""
    state: ProxyState = request.app.state.proxy
    claim = await admit(request)
    if isinstance(claim, Refusal):
        return state.metrics.refused(api_type, openai_refusal(claim))
    body = await read_json_object(request, state.max_body_bytes, state.body_read_timeout_s)
    if isinstance(body, Response):
        return state.metrics.refused(api_type, body)
    enforced = enforce(claim.sampling, body)  # the job's sampling policy, from the token
    sent = await within_budget(state.budgets, claim, body if enforced is None else enforced[0])
    if isinstance(sent, Refusal):
        return state.metrics.refused(api_type, openai_refusal(sent))
    upstream_body, view = state.engine.rewrite_request(api_type, sent, state.served_model)
    try:
        seq = await number_call(state.seqs, state.receipts, claim)
    except BackendUnavailable as exc:  # a call counter is unreachable: retryable 503
        return state.metrics.refused(api_type, exc.response())
    call = new_call(
        claim.rollout_id, seq, api_type, body, upstream_body, view, claim.purpose, claim.attempt
    )
    if sent is not body:  # stored with the call: the values the engine used
        call.engine_request = upstream_body
    if state.tito is not None and api_type == CHAT and not claim.chat_only:  # TITO if it extends
        token_prompt = await state.tito.route(state.backends, call, upstream_body)
        if token_prompt is not None:
            path, upstream_body = token_prompt.path, token_prompt.body
    if call.stream:
        return await forward_stream(state, call, path, upstream_body)
    forward = forward_json(state, call, path, upstream_body)
    return await unless_client_leaves(state, call, request.receive, forward)


async def chat_completions(request: Request) -> Response:
    return await _generate(request, CHAT, CHAT_PATH)


async def completions(request: Request) -> Response:
    return await _generate(request, COMPLETIONS, COMPLETIONS_PATH)


async def models(request: Request) -> Response:
    """The served model, as the agent should name it; asked upstream when none is configured."""
    state: ProxyState = request.app.state.proxy
    claim = await admit(request)
    if isinstance(claim, Refusal):
        return openai_refusal(claim)
    if state.served_model is not None:
        card = {"id": state.served_model, "object": "model", "created": 0, "owned_by": "polar_mq"}
        return _json({"object": "list", "data": [card]})
    try:
        upstream = await state.backends.primary.client.get("/v1/models")
    except Exception as exc:  # httpx errors: the agent only needs to know it failed
        return bad_gateway(f"upstream inference server unavailable ({type(exc).__name__})")
    ctype = upstream.headers.get("content-type", "application/json")
    return Response(upstream.content, upstream.status_code, headers={"content-type": ctype})


async def root(request: Request) -> Response:
    """`GET`/`HEAD /`: some harnesses (Claude Code) probe the base URL before their first call."""
    return _json({"status": "ok", "service": "polar_mq proxy"})


async def healthz(request: Request) -> Response:
    state: ProxyState = request.app.state.proxy
    worker = state.siblings.slot.index if state.siblings is not None else 0
    backends = list(state.backends.backends.values())
    usable = sum(1 for b in backends if not b.draining and b.usable())
    return _json(
        {
            "status": "ok",
            "started_at": state.started_at,
            "worker": worker,
            "pid": os.getpid(),
            "backends": len(backends),
            "backends_usable": usable,  # counts only: engine addresses stay private
        }
    )


async def admin_flush(request: Request) -> Response:
    """Wait until every call logged so far is in the database (tests, benchmarks, shutdown)."""
    state: ProxyState = request.app.state.proxy
    if not admin_allowed(request, state.admin_token):
        return unauthorized("admin token required")
    try:
        written = await state.sink.flush()
    except CallsNotStored as exc:  # spilled rows not replayed yet: never report them stored
        error = {"message": str(exc), "type": "service_unavailable", "code": "calls_not_stored"}
        return _json({"error": error, **state.sink.stats()}, 503)
    return _json({**state.sink.stats(), "written": written, "started_at": state.started_at})
