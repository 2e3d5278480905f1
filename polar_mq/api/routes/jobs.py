"""Job routes: submit, list, status and results by cursor."""

from __future__ import annotations

import logging
import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from starlette.responses import Response

from polar_mq.api.access import job_access, require
from polar_mq.api.auth import Principal
from polar_mq.api.broker_gate import require_broker
from polar_mq.api.deps import SessionDep, SettingsDep, get_principal
from polar_mq.api.errors import ApiError
from polar_mq.api.responses import OrjsonResponse
from polar_mq.api.schemas import SubmitResponse, error_responses
from polar_mq.config import Settings
from polar_mq.dispatch.submit import submit_job
from polar_mq.jobs import queries, results
from polar_mq.jobs.context_check import CONTEXT_OVERFLOW, context_problem
from polar_mq.jobs.group_stats import GRPO_EPS
from polar_mq.jobs.read_models import JobPage, JobStatus, ResultsPage
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.served_models import UNKNOWN_MODEL, choose_model, engine_models
from polar_mq.tenants.floors import floor_of
from polar_mq.tenants.quotas import Owner, tenant_quota
from polar_mq.tenants.scopes import JOBS_READ, JOBS_WRITE

log = logging.getLogger(__name__)
router = APIRouter(
    prefix="/v1/jobs",
    tags=["jobs"],
    dependencies=[Depends(get_principal)],
    responses=error_responses(401, 403, 422, 503),
)

Cursor = Annotated[str | None, Query(description="next_cursor (or a group's cursor) of a page")]


@router.post(
    "",
    status_code=201,
    response_model=SubmitResponse,
    responses={
        200: {"model": SubmitResponse, "description": "Existing job of this idempotency_key"},
        **error_responses(400, 409, 413, 429),
    },
    dependencies=[Depends(require(JOBS_WRITE)), Depends(require_broker)],
)
def submit(
    spec: JobCreate,
    session: SessionDep,
    settings: SettingsDep,
    principal: Annotated[Principal, Depends(require(JOBS_WRITE))],
) -> Response:
    """Create a job of the key's tenant: tasks x samples_per_task rollouts, queued once the rows
    are committed. Over a quota: 422 (this request alone) or 429 (rollouts in flight). Below
    the operator's isolation floor (a key without the admin scope): 422 `isolation_floor`."""
    quota = tenant_quota(settings, principal.tenant, principal.quota)
    owner = Owner(principal.tenant, quota, floor_of(settings, bound=not principal.is_admin))
    problem = context_problem(spec, settings.served_model_max_len)
    if problem is not None:  # every call of the job would be refused by the engine
        raise ApiError(422, CONTEXT_OVERFLOW, problem)
    spec = _with_served_model(spec, settings)
    job = submit_job(session, spec, settings.pool, owner)
    if job.created:
        log.info(
            "job %s submitted by %s: %d rollouts",
            job.job_id,
            principal.name,
            len(job.rollout_ids),
            extra={"job_id": str(job.job_id)},  # a JSON line's field, like the stages' lines
        )
    body = {"job_id": job.job_id, "rollout_ids": job.rollout_ids, "created": job.created}
    return OrjsonResponse(body, status_code=201 if job.created else 200)


def _with_served_model(spec: JobCreate, settings: Settings) -> JobCreate:
    """`spec` with the engine's model when it names none; 422 for a model the engine does not
    serve (`polar_mq.jobs.served_models`; nothing to check when the proxy maps every name)."""
    if settings.served_model is not None:
        return spec
    upstream = settings.upstream_urls[0] if settings.upstream_urls else settings.upstream_url
    choice = choose_model(spec.model, engine_models(upstream))
    if choice.problem is not None:
        raise ApiError(422, UNKNOWN_MODEL, choice.problem)
    return spec if choice.model == spec.model else spec.model_copy(update={"model": choice.model})


@router.get("", response_model=JobPage, responses=error_responses(400))
def list_jobs(
    session: SessionDep,
    principal: Annotated[Principal, Depends(require(JOBS_READ))],
    limit: Annotated[int, Query(ge=1, le=queries.MAX_PAGE)] = 50,
    cursor: Cursor = None,
) -> Response:
    """Jobs of the key's tenant (every tenant's for `admin`), newest first."""
    return OrjsonResponse(queries.list_jobs(session, limit, cursor, principal.visible_tenant))


@router.get(
    "/{job_id}",
    response_model=JobStatus,
    responses=error_responses(404),
    dependencies=[Depends(job_access(JOBS_READ))],
)
def job_status(job_id: uuid.UUID, session: SessionDep) -> Response:
    """Totals, per-stage counts, outcomes, group completion and mean reward."""
    return OrjsonResponse(queries.job_status(session, job_id))


@router.get(
    "/{job_id}/results",
    response_model=ResultsPage,
    responses=error_responses(400, 404),
    dependencies=[Depends(job_access(JOBS_READ))],
)
def job_results(
    job_id: uuid.UUID,
    session: SessionDep,
    cursor: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=queries.MAX_PAGE, description="groups per page")] = 100,
    complete_only: Annotated[
        bool, Query(description="only groups whose rollouts are all terminal, by completion")
    ] = True,
    include_trajectories: Annotated[
        bool, Query(description="add token ids, loss masks and logprobs to every sample")
    ] = False,
    advantages: Annotated[
        Literal["grpo"] | None,
        Query(
            description="grpo: add each usable sample's (reward - mean) / (std + "
            f"{GRPO_EPS:g}) over the usable samples of its complete group (population std)"
        ),
    ] = None,
) -> Response:
    """One page of groups; follow next_cursor until it is null.

    Infrastructure failures carry a null reward and are left out of the group statistics; a
    complete group that has any is marked `incomplete`.
    """
    page = results.job_results(
        session, job_id, cursor, limit, complete_only, include_trajectories, advantages=advantages
    )
    return OrjsonResponse(page)
