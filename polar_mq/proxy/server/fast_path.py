"""The generate routes served straight from ASGI, in front of Starlette's routing and middleware.

Each agent call used to pass Starlette's middleware stack (error and exception middleware, the
body-deadline middleware wrapping `receive` and `send`) and its route table (a regex per route
tried in turn, about fifty routes with the `/r/{token}` copies) before its handler ran: a fifth
of the proxy's CPU per call (`bench/proxy/hot.py`). The routes agents call on every turn (chat,
completions, Anthropic Messages, OpenAI Responses, also under `/r/{token}`) are looked up here in
one dict and their handler is called directly; their body deadline is kept by
`body.read_json_object`. Everything else (admin, metrics, tokenize, Gemini's parameterised paths,
wrong methods) goes to the Starlette app as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]

TOKEN_PREFIX = "/r/"
WHOLE_RESPONSE = "polar_mq.whole_response"
"""ASGI scope extension of the lean server (`http_conn`): write a complete response at once."""
NO_EXTENSIONS: dict[str, Any] = {}


class FastPathApp(Starlette):
    """Starlette, with `hot` POST routes looked up first by exact path (also under `/r/{token}`)."""

    def __init__(self, *args: Any, hot: dict[str, Endpoint], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hot = hot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            endpoint = self.hot.get(path)
            if endpoint is None and path.startswith(TOKEN_PREFIX):
                token, slash, rest = path[len(TOKEN_PREFIX) :].partition("/")
                endpoint = self.hot.get(slash + rest) if token else None
                if endpoint is not None:
                    scope["path_params"] = {"token": token}
            if endpoint is not None:
                scope["app"] = self
                response = await endpoint(Request(scope, receive, send))
                if type(response) is Response and response.background is None:
                    whole = scope.get("extensions", NO_EXTENSIONS).get(WHOLE_RESPONSE)
                    if whole is not None:  # the lean server: head and body in one write
                        whole(response.status_code, response.raw_headers, response.body)
                        return
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)
