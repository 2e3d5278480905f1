"""`/tokenize` and `/detokenize` passthrough (also under `/v1/` and `/r/{token}/`), with auth.

Agents and harnesses use the engine's tokenizer to count or budget tokens; they reach it through
the proxy like everything else, with their rollout token (nothing reaches the engine without one)
and the model name they know, rewritten to the served one. These calls are not logged: they
generate nothing. They go to the first backend: all backends serve the same model, hence the same
tokenizer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from starlette.requests import Request
from starlette.responses import Response

from polar_mq.proxy.errors import bad_gateway
from polar_mq.proxy.rollout_states import Refusal
from polar_mq.proxy.server.body import read_json_object
from polar_mq.proxy.server.gate import admit, openai_refusal
from polar_mq.proxy.server.state import ProxyState

PATHS = ("/tokenize", "/detokenize")


async def _forward(request: Request, upstream_path: str) -> Response:
    state: ProxyState = request.app.state.proxy
    claim = await admit(request)
    if isinstance(claim, Refusal):
        return openai_refusal(claim)
    body = await read_json_object(request, state.max_body_bytes, state.body_read_timeout_s)
    if isinstance(body, Response):
        return body
    if state.served_model is not None and "model" in body:
        body["model"] = state.served_model
    try:
        upstream = await state.backends.primary.post_small(upstream_path, orjson.dumps(body))
    except Exception as exc:  # httpx errors: the agent only needs to know it failed
        return bad_gateway(f"upstream inference server unavailable ({type(exc).__name__})")
    ctype = upstream.content_type or "application/json"
    return Response(upstream.content, upstream.status_code, headers={"content-type": ctype})


async def tokenize(request: Request) -> Response:
    return await _forward(request, "/tokenize")


async def detokenize(request: Request) -> Response:
    return await _forward(request, "/detokenize")


Handler = Callable[[Request], Awaitable[Response]]


def tokenize_routes() -> list[tuple[str, Handler]]:
    """(path, handler) for every spelling an agent may use, before the `/r/{token}` prefix."""
    handlers: dict[str, Handler] = {"/tokenize": tokenize, "/detokenize": detokenize}
    return [(prefix + path, handlers[path]) for path in PATHS for prefix in ("", "/v1")]
