"""Response models of the API itself; the read models come from `polar_mq.jobs.read_models`.

The query dataclasses double as response models (FastAPI derives their schema), so the documented
status, results and rollout shapes are exactly what the handlers serialize.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, Field


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
    """OpenAPI entries for the error statuses a route can answer with."""
    described = {
        400: "Malformed request (invalid JSON, invalid cursor)",
        401: "Missing or invalid API key",
        404: "No such job or rollout",
        409: "Idempotency key reused with a different body",
        413: "Request body too large",
        422: "Request failed validation",
        503: "Database unavailable",
    }
    return {
        status: {"model": ErrorResponse, "description": described.get(status, "Error")}
        for status in statuses
    }
