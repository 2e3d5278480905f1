"""The Gemini API family: `POST /v1beta/models/{model}:{action}` (and `/v1/...`), as chat calls.

Agents built on Google's SDKs (`google-genai`) or raw REST call `generateContent`,
`streamGenerateContent` (`?alt=sse`, or a progressively written JSON array without it) and
`countTokens`. The first two are translated to the engine's chat completions
(`gemini_request`), go through the shared hot path (`route.family_endpoint`: backend pool,
exact token capture, one logged call) and come back in Gemini's shape (`gemini_response`).
`countTokens` generates nothing, so it is not a logged call: it asks the first backend's
`/tokenize` for the same chat messages the generation would send, so the count is the engine's
own. The rollout token arrives as `x-goog-api-key`, `?key=` or in the `/r/{token}` path
(`polar_mq.proxy.server.auth`). Errors, ours and the shared path's, are in Google's shape
(`{"error": {"code", "message", "status"}}`), which Google's SDKs turn into their exceptions.
"""

from __future__ import annotations

import sys
from typing import Any, cast

import orjson
from starlette.requests import Request
from starlette.responses import Response

from polar_mq.proxy.apis.base import (
    NOT_FOUND,
    ApiFamily,
    FamilyError,
    FamilyRequest,
    StreamTranslator,
    Translation,
)
from polar_mq.proxy.apis.gemini_request import (
    check_unsupported,
    get,
    sampling,
    split_action,
    to_chat_messages,
    to_chat_tools,
    tool_choice,
)
from polar_mq.proxy.apis.gemini_response import GeminiStream, error_document
from polar_mq.proxy.apis.gemini_response import render as render_response
from polar_mq.proxy.apis.route import (
    Handler,
    count_prompt_tokens,
    family_endpoint,
    reshape_error,
)
from polar_mq.proxy.rollout_states import Refusal
from polar_mq.proxy.server.body import read_json_object
from polar_mq.proxy.server.gate import admit, kind_of
from polar_mq.proxy.server.state import ProxyState

NAME = "gemini"
GENERATE = "generateContent"
STREAM = "streamGenerateContent"
COUNT = "countTokens"
ACTIONS = (GENERATE, STREAM, COUNT)
PREFIXES = ("/v1beta", "/v1")
JSON_HEADERS = {"content-type": "application/json"}


def to_chat(body: dict[str, Any], request: FamilyRequest) -> Translation:
    """The chat request for a `generateContent`/`streamGenerateContent` body."""
    model, action = split_action(str(request.path_params.get("model_action", "")))
    if action not in (GENERATE, STREAM):
        raise FamilyError(f"unsupported action {action!r}", 404, NOT_FOUND)
    if not model:
        raise FamilyError("the path names no model (`models/<model>:<action>`)")
    stream = action == STREAM
    chat = chat_request(body, model)
    chat["stream"] = stream
    if stream:
        chat["stream_options"] = {"include_usage": True}
    context = {"sse": request.query.get("alt") == "sse"}
    return Translation(chat=chat, stream=stream, agent_model=model, context=context)


def chat_request(body: dict[str, Any], model: str) -> dict[str, Any]:
    """Messages, tools, tool choice and sampling of a `GenerateContentRequest` (no stream flag)."""
    check_unsupported(body)
    chat: dict[str, Any] = {"model": model, "messages": to_chat_messages(body)}
    tools = to_chat_tools(body)
    if tools:
        chat["tools"] = tools
    choice = tool_choice(body)
    if choice is not None:
        chat["tool_choice"] = choice
    chat.update(sampling(body))
    return chat


def render(data: dict[str, Any], translation: Translation) -> dict[str, Any]:
    """The `GenerateContentResponse` for the engine's chat response `data`."""
    return render_response(data, translation)


def stream(translation: Translation) -> StreamTranslator:
    """SSE events with `?alt=sse`, else one JSON array written element by element."""
    return GeminiStream(translation, sse=bool(translation.context.get("sse")))


def error_response(status: int, kind: str, message: str) -> Response:
    """`{"error": {"code", "message", "status"}}` with Google's status name for `status`."""
    document = error_document(status, message, kind)
    return Response(orjson.dumps(document), status, headers=JSON_HEADERS)


def _family() -> ApiFamily:
    return cast(ApiFamily, sys.modules[__name__])


async def count_tokens(request: Request) -> Response:
    """`{"totalTokens": N}` from the engine's tokenizer for the chat form of the request.

    Accepts `contents` (+ `systemInstruction`, `tools`) or a whole `generateContentRequest`;
    authenticated like every call, never logged, sent to the first backend (all backends serve
    the same model, hence the same tokenizer and chat template).
    """
    state: ProxyState = request.app.state.proxy
    claim = await admit(request)
    if isinstance(claim, Refusal):
        refusal = error_response(claim.status, kind_of(claim), claim.message)
        return state.metrics.refused(NAME, refusal)
    body = await read_json_object(request, state.max_body_bytes, state.body_read_timeout_s)
    if isinstance(body, Response):
        return state.metrics.refused(NAME, reshape_error(body, _family()))
    inner = get(body, "generateContentRequest")
    source = inner if isinstance(inner, dict) else body
    try:
        chat = chat_request(source, "")
    except FamilyError as exc:
        return state.metrics.refused(NAME, error_response(exc.status, exc.kind, exc.message))
    try:
        count = await count_prompt_tokens(state, chat)
    except FamilyError as exc:
        return error_response(exc.status, exc.kind, exc.message)
    return Response(orjson.dumps({"totalTokens": count}), 200, headers=JSON_HEADERS)


_generate: Handler = family_endpoint(_family())


async def model_action(request: Request) -> Response:
    """Dispatch `<model>:<action>`: generation through the shared path, counting, or a 404."""
    model, action = split_action(str(request.path_params.get("model_action", "")))
    if action in (GENERATE, STREAM):
        return await _generate(request)
    if action == COUNT:
        return await count_tokens(request)
    state: ProxyState = request.app.state.proxy
    message = (
        f"action {action!r} is not supported on models/{model} (supported: {', '.join(ACTIONS)})"
    )
    return state.metrics.refused(NAME, error_response(404, NOT_FOUND, message))


def routes() -> list[tuple[str, Handler, str]]:
    """(path, handler, method) for `/v1beta/models/{model_action}` and `/v1/models/...`."""
    return [(f"{prefix}/models/{{model_action}}", model_action, "POST") for prefix in PREFIXES]
