"""Request parsing for the fake engine: vLLM's validation rules and its error shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from starlette.responses import Response

from polar_mq.testing.fake_tokenizer import VOCAB_SIZE, encode

MAX_LOGPROBS = 20


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json")


def error_response(exc: BadRequest) -> Response:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(exc.status, "InternalServerError")
    error = {"message": str(exc), "type": kind, "param": exc.param, "code": exc.status}
    return json_response({"error": error}, exc.status)


def take_int(
    body: dict[str, Any], key: str, default: int | None, low: int, high: int
) -> int | None:
    """`body[key]` as an int in [low, high] (or `default` when absent); 400 otherwise."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"`{key}` must be an integer in [{low}, {high}]", param=key)
    return int(value)


def parse_prompts(prompt: Any) -> list[list[int]]:
    """vLLM's prompt forms: a string, token ids, or a batch of either."""
    if isinstance(prompt, str):
        return [encode(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [_checked(prompt)]
        if all(isinstance(p, str) for p in prompt):
            return [encode(p) for p in prompt]
        if all(isinstance(p, list) and p for p in prompt):
            return [_checked(p) for p in prompt]
    raise BadRequest("`prompt` must be a string, a list of token ids, or a batch of them")


def _checked(ids: Sequence[Any]) -> list[int]:
    if not all(isinstance(t, int) and 0 <= t < VOCAB_SIZE for t in ids):
        raise BadRequest(f"token ids must be integers in [0, {VOCAB_SIZE})", param="prompt")
    return list(ids)
