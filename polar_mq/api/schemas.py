"""Response models of the API itself; the read models come from `polar_mq.jobs.read_models`.

The query dataclasses double as response models (FastAPI derives their schema), so the documented
status, results and rollout shapes are exactly what the handlers serialize.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool


class SubmitResponse(BaseModel):
    job_id: uuid.UUID
    rollout_ids: list[uuid.UUID] = Field(description="in (task_index, sample_index) order")
    created: bool = Field(description="false when the idempotency_key named an existing job")


class ErrorDetail(BaseModel):
    path: str = Field(description="dotted path of the offending field, e.g. tasks.0.instruction")
    message: str


class ErrorBody(BaseModel):
    type: str = Field(description="stable machine-readable kind, e.g. validation_error, not_found")
    message: str = Field(description="one human-readable line saying what to fix")
    details: list[ErrorDetail] | None = Field(None, description="per-field validation errors")


class ErrorResponse(BaseModel):
    error: ErrorBody


class HealthResponse(BaseModel):
    status: str


class ReadyResponse(BaseModel):
    status: str
    checks: dict[str, str] = Field(description="per dependency: ok, or why it is not")


class NotReadyResponse(BaseModel):
    error: ErrorBody
    checks: dict[str, str]


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can answer with, all in the error model.

    The app declares the ones every operation can get (`EVERY_OPERATION`); routers add theirs
    (401/403/503), routes the rest, so the schema lists exactly what a client may see.
    """
    described = {
        400: "Malformed request (invalid JSON, invalid cursor)",
        401: "Missing or invalid API key",
        403: "The API key lacks the scope this route needs",
        404: "No such job, rollout or delivery (or it belongs to another tenant)",
        408: "The request body did not arrive within the body read timeout (the connection is "
        "closed after this answer)",
        409: "Idempotency key reused with a different body; a delivery superseded, acknowledged "
        "or leased by another consumer",
        413: "Request body too large",
        422: "Request failed validation, or one request over a quota (quota_exceeded)",
        429: "Over the tenant's quota of rollouts in flight (quota_exceeded); retry later",
        503: "Database unavailable",
    }
    return {
        status: {"model": ErrorResponse, "description": described.get(status, "Error")}
        for status in statuses
    }


EVERY_OPERATION = (408, 413)
"""Answered by the body-timeout and body-limit middlewares in front of every route, GETs
included (a GET may carry a body too)."""


# --------------------------------------------------------------------------------------------
# Group leases (streaming groups to trainers)

MAX_LEASE_S = 24 * 3600.0
MAX_WAIT_S = 120.0
"""Longer long-polls only fight the idle timeouts of the proxies between trainer and API."""
CONSUMER_PATTERN = r"^[^\x00-\x1f\x7f]+$"
"""Printable names only: a NUL cannot be stored by PostgreSQL, so it is a 422, not a 500."""
ConsumerName = Field(
    min_length=1,
    max_length=200,
    pattern=CONSUMER_PATTERN,
    description="who holds the leases: any stable name of the trainer process (no control "
    "characters)",
)


class LeaseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    consumer: str = ConsumerName
    max_groups: int = Field(16, ge=1, le=1000, strict=True, description="at most this many groups")
    lease_s: float = Field(
        60.0,
        gt=0,
        le=MAX_LEASE_S,
        strict=True,
        description="unacked groups are handed out again this long after the lease",
    )
    wait_s: float = Field(
        0.0,
        ge=0,
        strict=True,
        le=MAX_WAIT_S,
        description="long-poll: answer as soon as one group is leased, or after this long",
    )
    max_in_flight: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="lease nothing while this consumer holds this many unacked groups",
    )
    include_trajectories: StrictBool = False
    advantages: Literal["grpo"] | None = None


class DeliveriesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    consumer: str = ConsumerName
    delivery_ids: list[str] = Field(max_length=1000, description="as handed out by a lease")


class ExtendRequest(DeliveriesRequest):
    lease_s: float = Field(
        60.0, gt=0, le=MAX_LEASE_S, strict=True, description="new lease: now + lease_s"
    )
