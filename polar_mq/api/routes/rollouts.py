"""Rollout routes: detail with events and timings, trajectory, captured LLM calls, artifacts."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from starlette.responses import Response

from polar_mq.api.access import rollout_access
from polar_mq.api.deps import SessionDep, get_principal
from polar_mq.api.responses import OrjsonResponse
from polar_mq.api.schemas import error_responses
from polar_mq.jobs.read_models import RolloutCalls, RolloutDetail, RolloutTrajectory
from polar_mq.rollouts import artifact_queries, queries
from polar_mq.tenants.scopes import JOBS_READ

router = APIRouter(
    prefix="/v1/rollouts",
    tags=["rollouts"],
    dependencies=[Depends(get_principal)],
    responses=error_responses(401, 403, 404, 422, 503),
)
READ = [Depends(rollout_access(JOBS_READ))]


@router.get("/{rollout_id}", response_model=RolloutDetail, dependencies=READ)
def rollout_detail(rollout_id: uuid.UUID, session: SessionDep) -> Response:
    """Fields, event log, per-stage timings, error and the evaluator's verdict."""
    return OrjsonResponse(queries.rollout_detail(session, rollout_id))


@router.get("/{rollout_id}/trajectory", response_model=RolloutTrajectory, dependencies=READ)
def rollout_trajectory(rollout_id: uuid.UUID, session: SessionDep) -> Response:
    """Training samples (token ids, loss mask, logprobs) of the current attempt."""
    return OrjsonResponse(queries.rollout_trajectory(session, rollout_id))


@router.get("/{rollout_id}/calls", response_model=RolloutCalls, dependencies=READ)
def rollout_calls(rollout_id: uuid.UUID, session: SessionDep) -> Response:
    """LLM calls captured by the proxy, in order, with token ids and logprobs."""
    return OrjsonResponse(queries.rollout_calls(session, rollout_id))


AttemptQuery = Annotated[
    int | None, Query(ge=1, description="the attempt (default: the rollout's current one)")
]


@router.get(
    "/{rollout_id}/artifacts", response_model=artifact_queries.RolloutArtifacts, dependencies=READ
)
def rollout_artifacts(
    rollout_id: uuid.UUID, session: SessionDep, attempt: AttemptQuery = None
) -> Response:
    """The agent's output log, its harness's transcript and the workspace diff, by name."""
    return OrjsonResponse(artifact_queries.list_artifacts(session, rollout_id, attempt))


@router.get(
    "/{rollout_id}/artifacts/{name}",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}, "application/octet-stream": {}}}},
    dependencies=READ,
)
def rollout_artifact(
    rollout_id: uuid.UUID,
    name: Annotated[str, Path(max_length=128)],
    session: SessionDep,
    attempt: AttemptQuery = None,
) -> Response:
    """One artifact's content as stored (its tail when `truncated`)."""
    content, media_type = artifact_queries.artifact_content(session, rollout_id, name, attempt)
    return Response(content, media_type=media_type)
