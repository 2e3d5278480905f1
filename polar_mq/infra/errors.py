"""Errors every layer may raise about the domain's objects, below all the packages that do.

`PolarError` is their one base: each error carries the HTTP status and stable `type` the API
answers it with (and any `details` or headers), so the API renders all of them with one handler
(`polar_mq.api.errors`) and a new error needs no handler of its own. The errors themselves stay
beside the code that raises them (`jobs`, `tenants`, `policy`, `submit`); only `NotFound`, which
every package raises, lives here. Raising one outside a request (the CLI, a worker) is just an
exception whose `str()` is its message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class PolarError(Exception):
    """A domain error with the status, type, message, details and headers of its API answer.

    A subclass sets `status` and `type` as class attributes; one whose status or type depends
    on the case (a quota: 422 or 429; a delivery conflict: which conflict) passes them to this
    constructor instead.
    """

    status: int = 400
    type: str = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        type: str | None = None,
        details: Sequence[Mapping[str, str]] = (),
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        self.details: list[dict[str, str]] = [dict(detail) for detail in details]
        """Per-field problems (`{"path": ..., "message": ...}`), rendered as `error.details`."""
        self.headers: dict[str, str] | None = dict(headers) if headers else None
        """Response headers the answer carries (`Retry-After` of a quota, say)."""


class NotFound(PolarError, LookupError):
    """The job or rollout does not exist (the API answers 404)."""

    status = 404
    type = "not_found"

    def __init__(self, kind: str, ident: object) -> None:
        super().__init__(f"{kind} {ident} not found")
        self.kind = kind
