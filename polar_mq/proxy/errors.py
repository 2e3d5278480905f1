"""Errors in the OpenAI shape (`{"error": {"message", "type", "code"}}`) that SDK clients parse."""

from __future__ import annotations

import orjson
from starlette.responses import Response


def openai_error(status: int, message: str, type_: str, code: str) -> Response:
    body = {"error": {"message": message, "type": type_, "code": code}}
    return Response(orjson.dumps(body), status, media_type="application/json")


def unauthorized(message: str) -> Response:
    return openai_error(401, message, "invalid_request_error", "invalid_api_key")


def bad_request(message: str, code: str = "invalid_request") -> Response:
    return openai_error(400, message, "invalid_request_error", code)


def too_large(limit: int) -> Response:
    return openai_error(
        413, f"request body exceeds {limit} bytes", "invalid_request_error", "request_too_large"
    )


def request_timeout(message: str) -> Response:
    """The body did not arrive in time; the connection is closed after this answer."""
    response = openai_error(408, message, "invalid_request_error", "request_timeout")
    response.headers["connection"] = "close"
    return response


def bad_gateway(message: str) -> Response:
    return openai_error(502, message, "upstream_error", "bad_gateway")
