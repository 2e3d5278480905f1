"""Every error the API returns has one shape: `{"error": {"type": ..., "message": ...}}`.

Trainers script against the API, so an error must be machine-readable (a stable `type`) and say in
one line what to fix (the `message` names the offending field path). Bad input is always a 4xx:
validation errors are rewritten from pydantic's nested form, a malformed body is `invalid_json`,
and anything unexpected is a 500 whose body never leaks a traceback.

Every domain error derives from `polar_mq.infra.errors.PolarError`, which carries its own status,
type, details and headers, so one handler answers them all; the other handlers here are for what the
framework and the database raise (validation, HTTP errors, a refused value, a lost connection).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import DataError, OperationalError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from polar_mq.api.allow import allowed_methods
from polar_mq.api.responses import OrjsonResponse
from polar_mq.infra.body_timeout import BodyReadTimeout
from polar_mq.infra.errors import PolarError

log = logging.getLogger(__name__)

STATUS_TYPES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "too_many_requests",
    503: "unavailable",
}
MAX_LISTED_ERRORS = 10
FASTAPI_BODY_ERROR = "There was an error parsing the body"


class ApiError(PolarError):
    """An error with its HTTP status and stable type, raised by routes and dependencies."""

    def __init__(
        self, status: int, type: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message, status=status, type=type, headers=headers)


def error_payload(
    type: str, message: str, details: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"type": type, "message": message}
    if details:
        body["details"] = details
    return {"error": body}


def error_response(
    status: int,
    type: str,
    message: str,
    *,
    headers: Mapping[str, str] | None = None,
    details: list[dict[str, str]] | None = None,
) -> Response:
    body = error_payload(type, message, details)
    return OrjsonResponse(body, status_code=status, headers=headers)


# --------------------------------------------------------------------------------------------
# Validation errors → one readable line


def _path(loc: Sequence[int | str]) -> str:
    parts = list(loc[1:]) if loc and loc[0] in ("body", "query", "path", "header") else list(loc)
    return ".".join(str(p) for p in parts)


def _message(error: dict[str, Any]) -> tuple[str, str]:
    """(path, message) of one pydantic error, worded for a person fixing a job file."""
    path = _path(error.get("loc", ()))
    kind = error.get("type", "")
    msg = str(error.get("msg", "invalid value"))
    if kind == "extra_forbidden":
        return path, "unknown field (not allowed here)"
    if kind == "missing":
        return path, "field required"
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    # Validators of a list often say `tasks[3] needs ...`: fold the index into the path.
    leaf = path.rsplit(".", 1)[-1]
    folded = re.match(rf"{re.escape(leaf)}\[(\d+)\]\s*:?\s*(.*)", msg, re.S) if leaf else None
    if folded:
        return f"{path}.{folded.group(1)}", folded.group(2)
    return path, msg


def _body_problem(errors: Sequence[dict[str, Any]]) -> str | None:
    """The message when the body is not a JSON document at all, else None."""
    for error in errors:
        loc = tuple(error.get("loc", ()))
        if error.get("type") == "json_invalid":
            detail = (error.get("ctx") or {}).get("error", "malformed JSON")
            position = loc[1] if len(loc) > 1 else "?"
            return f"request body is not valid JSON: {detail} (at character {position})"
        if loc == ("body",) and error.get("type") == "missing":
            return "request body is required: a JSON object"
        if loc == ("body",) and isinstance(error.get("input"), bytes | bytearray):
            return "request body must be JSON sent with Content-Type: application/json"
    return None


def describe_validation_error(
    exc: RequestValidationError,
) -> tuple[int, str, str, list[dict[str, str]]]:
    """(status, type, message, details) for a request that failed validation."""
    errors = list(exc.errors())
    problem = _body_problem(errors)
    if problem is not None:
        return 400, "invalid_json", problem, []
    details = [{"path": p, "message": m} for p, m in map(_message, errors)]
    lines = [f"{d['path']}: {d['message']}" if d["path"] else d["message"] for d in details]
    message = "; ".join(lines[:MAX_LISTED_ERRORS])
    if len(lines) > MAX_LISTED_ERRORS:
        message += f"; and {len(lines) - MAX_LISTED_ERRORS} more"
    return 422, "validation_error", message or "invalid request", details


# --------------------------------------------------------------------------------------------
# Handlers


async def _validation(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    status, type_, message, details = describe_validation_error(exc)
    return error_response(status, type_, message, details=details)


async def _http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    type_ = STATUS_TYPES.get(exc.status_code, "http_error")
    headers = exc.headers
    if exc.status_code == 404 and exc.detail == "Not Found":
        message = f"no such endpoint: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        allow = ", ".join(allowed_methods(request))
        message = f"method {request.method} not allowed on {request.url.path} (allowed: {allow})"
        headers = {**(exc.headers or {}), "Allow": allow}
    elif exc.status_code == 400 and exc.detail == FASTAPI_BODY_ERROR:
        # A body FastAPI could not even decode (not UTF-8, say): the same error as bad JSON.
        type_, message = "invalid_json", "request body is not valid JSON (not decodable as UTF-8)"
    else:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    return error_response(exc.status_code, type_, message, headers=headers)


async def _polar(_request: Request, exc: Exception) -> Response:
    """Every domain error (`polar_mq.infra.errors.PolarError`): it carries its own answer."""
    assert isinstance(exc, PolarError)
    return error_response(
        exc.status, exc.type, exc.message, headers=exc.headers, details=exc.details
    )


async def _data_error(request: Request, exc: Exception) -> Response:
    # The database refused a value (out of range, bad encoding): bad input, never a 500.
    log.warning("database refused a value in %s %s: %s", request.method, request.url.path, exc)
    return error_response(422, "validation_error", "a value in the request cannot be stored")


async def _database_down(request: Request, exc: Exception) -> Response:
    log.error("database unavailable during %s %s: %s", request.method, request.url.path, exc)
    return error_response(503, "unavailable", "database unavailable", headers={"Retry-After": "5"})


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "internal server error; see the API server log")


def body_timeout_response(exc: BodyReadTimeout) -> Response:
    """A request body that did not arrive in time (`polar_mq.infra.body_timeout`); the connection is
    closed after it."""
    return error_response(408, "request_timeout", exc.message, headers=exc.headers)


def install_error_handlers(app: FastAPI) -> None:
    """One handler per family: domain errors (`PolarError`), the framework's, the database's,
    and the catch-all 500."""
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(PolarError, _polar)
    app.add_exception_handler(DataError, _data_error)
    app.add_exception_handler(OperationalError, _database_down)
    app.add_exception_handler(Exception, _unexpected)
