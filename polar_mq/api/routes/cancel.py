"""Cancel routes: stop a whole job or one rollout at whatever stage it is in."""

from __future__ import annotations

import logging
import uuid
from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel
from starlette.responses import Response

from polar_mq.api.access import job_access, rollout_access
from polar_mq.api.auth import Principal
from polar_mq.api.deps import SessionDep, get_principal
from polar_mq.api.responses import OrjsonResponse
from polar_mq.api.schemas import error_responses
from polar_mq.lifecycle.cancel import cancel
from polar_mq.tenants.scopes import JOBS_WRITE

log = logging.getLogger(__name__)
router = APIRouter(
    prefix="/v1",
    tags=["cancel"],
    dependencies=[Depends(get_principal)],
    responses=error_responses(401, 403, 404, 422, 503),
)


class CancelResponse(BaseModel):
    cancelled: list[uuid.UUID]
    """Rollouts moved to `cancelled` by this call (running agents are killed within a heartbeat)."""
    already_terminal: int
    """Rollouts that had already ended and were left as they were."""


@router.post("/jobs/{job_id}/cancel", response_model=CancelResponse)
def cancel_job(
    job_id: uuid.UUID,
    session: SessionDep,
    principal: Annotated[Principal, Depends(job_access(JOBS_WRITE))],
) -> Response:
    """Cancel every unfinished rollout of the job. Safe to repeat."""
    result = cancel(session, job_id=job_id)
    log.info("job %s: %d rollouts cancelled by %s", job_id, len(result.cancelled), principal.name)
    body = {"cancelled": result.cancelled, "already_terminal": result.already_terminal}
    return OrjsonResponse(body)


@router.post(
    "/rollouts/{rollout_id}/cancel",
    response_model=CancelResponse,
    dependencies=[Depends(rollout_access(JOBS_WRITE))],
)
def cancel_rollout(rollout_id: uuid.UUID, session: SessionDep) -> Response:
    """Cancel one rollout. Safe to repeat."""
    result = cancel(session, rollout_id=rollout_id)
    body = {"cancelled": result.cancelled, "already_terminal": result.already_terminal}
    return OrjsonResponse(body)
