"""Policy routes: the trainer declares weight updates here (see `polar_mq.policy.service`).

Synchronous routes on purpose: a paused update waits for the proxies to drain (seconds), which
runs in the threadpool without a database session held (the service opens its own, briefly).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from datetime import datetime

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from starlette.responses import Response

from polar_mq.api.access import require_briefly
from polar_mq.api.deps import get_principal_briefly
from polar_mq.api.responses import OrjsonResponse
from polar_mq.api.schemas import error_responses
from polar_mq.policy.proxies import ProxyControl, ProxyReport
from polar_mq.policy.service import PolicyService, PolicyUpdate
from polar_mq.policy.weights import PATH_MAX, Adapter, path_problem
from polar_mq.tenants.scopes import POLICY_WRITE

log = logging.getLogger(__name__)
router = APIRouter(
    prefix="/v1/policy",
    tags=["policy"],
    dependencies=[Depends(get_principal_briefly), Depends(require_briefly(POLICY_WRITE))],
    responses=error_responses(401, 403, 422, 503),
)
"""Every policy route needs `policy:write`: the version is global (it pauses every proxy and moves
the capacity of every tenant's staleness-bound jobs), so it is granted apart from jobs."""

MAX_DRAIN_S = 600.0


class PolicyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(..., ge=0, le=2**31 - 1, strict=True, description="the new policy version")
    pause: bool = Field(
        False,
        strict=True,
        description="hold new LLM calls and drain the ones in flight before answering; call "
        "/v1/policy/resume once the new weights are loaded",
    )
    drain_timeout_s: float = Field(
        30.0,
        ge=0,
        le=MAX_DRAIN_S,
        strict=True,
        description="pause: wait at most this long for the drain",
    )
    adapter_path: str | None = Field(
        None,
        max_length=PATH_MAX,
        strict=True,
        description="new weights: a LoRA adapter directory (peft) the inference servers can read."
        " The proxies pause, drain, load it into every backend and resume (unless `pause`); "
        "calls after that are served by it whatever model name the agent sends",
    )

    checkpoint_path: str | None = Field(
        None,
        max_length=PATH_MAX,
        strict=True,
        description="new weights: a full model directory (config.json and weights) the "
        "inference servers reload from disk (SGLang's update_weights_from_disk; vLLM's "
        "reload_weights, dev mode only); the same pause, drain, load and resume as an adapter",
    )

    @field_validator("adapter_path", "checkpoint_path")
    @classmethod
    def _weights_shape(cls, value: str | None, info: ValidationInfo) -> str | None:
        problem = None if value is None else path_problem(value, str(info.field_name))
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_kind_of_weights(self) -> PolicyRequest:
        if self.adapter_path is not None and self.checkpoint_path is not None:
            raise ValueError("publish either adapter_path or checkpoint_path, not both")
        return self


class PolicyResponse(BaseModel):
    version: int
    paused: bool
    updated_at: datetime | None
    adapter: Adapter | None = None


class ResumeResponse(PolicyResponse):
    proxies: list[ProxyReport]
    """Each proxy's answer; one that did not confirm resumes from the database within seconds."""


def _service(request: Request) -> PolicyService:
    settings = request.app.state.settings
    control = ProxyControl(settings.proxy_admin_bases, settings.proxy_admin_token)
    return PolicyService(request.app.state.session_factory, control)


@router.get("", response_model=PolicyResponse)
def get_policy(request: Request) -> Response:
    """The current policy version and whether generation is paused for a weight update."""
    return OrjsonResponse(asdict(_service(request).get()))


@router.post("", response_model=PolicyUpdate, responses=error_responses(400, 409))
def set_policy(body: PolicyRequest, request: Request) -> Response:
    """Declare a new policy version (versions only go forward; repeating one is a no-op).

    Capacity and staleness of every job use it at once; LLM calls are stamped with it from now
    on (with `pause`: from the resume on, and calls in flight finish on the old weights first).
    With `adapter_path` (or `checkpoint_path`) the update loads the new weights too (pause,
    drain, load, resume).
    """
    update = _service(request).update(
        body.version, body.pause, body.drain_timeout_s, body.adapter_path, body.checkpoint_path
    )
    log.info(
        "policy version %d -> %d (paused=%s drained=%s in_flight=%d waited %.2f s)",
        update.previous_version, update.version, update.paused, update.drained,
        update.in_flight, update.waited_s,
    )  # fmt: skip
    return OrjsonResponse(asdict(update))


@router.post("/resume", response_model=ResumeResponse)
def resume_policy(request: Request) -> Response:
    """The new weights are loaded: let the held LLM calls go, served by the current version."""
    view, reports = _service(request).resume()
    failed = [r.url for r in reports if not r.ok]
    if failed:
        log.warning("resume not confirmed by %s (they resume from the database)", failed)
    return OrjsonResponse({**asdict(view), "proxies": [asdict(r) for r in reports]})
