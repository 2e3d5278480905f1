"""The API's lines carry the job or rollout a request is about (its path parameters)."""

from __future__ import annotations

from fastapi import Depends, FastAPI
from starlette.requests import Request

from polar_mq.observability.context import bind

PATH_FIELDS = ("job_id", "rollout_id")


async def bind_request_ids(request: Request) -> None:
    """A dependency of every route: binds `job_id` / `rollout_id` from the path, if present.

    Bound in the request's own context (its task; a sync route's thread gets a copy), so it
    ends with the request.
    """
    fields = {k: request.path_params[k] for k in PATH_FIELDS if k in request.path_params}
    if fields:
        bind(**fields)


def install_request_context(app: FastAPI) -> None:
    """Call before the routers are included: app dependencies apply to routes included after."""
    app.router.dependencies.append(Depends(bind_request_ids))
