"""Liveness and readiness probes; unauthenticated so orchestrators can call them."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from polar_mq.api.errors import error_payload
from polar_mq.api.readiness import OK, readiness
from polar_mq.api.responses import OrjsonResponse
from polar_mq.api.schemas import HealthResponse, NotReadyResponse, ReadyResponse

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthResponse)
async def healthz() -> Response:
    """200 while the process serves requests; says nothing about its dependencies."""
    return OrjsonResponse({"status": "ok"})


@router.get(
    "/readyz",
    response_model=ReadyResponse,
    responses={503: {"model": NotReadyResponse, "description": "A dependency is unreachable"}},
)
async def readyz(request: Request) -> Response:
    """200 when the database answers SELECT 1 and the broker accepts a connection, else 503."""
    state = request.app.state
    checks = await readiness(state.session_factory, state.settings.broker_url)
    failing = {name: result for name, result in checks.items() if result != OK}
    if not failing:
        return OrjsonResponse({"status": "ready", "checks": checks})
    message = "; ".join(f"{name}: {result}" for name, result in failing.items())
    body = {**error_payload("not_ready", message), "checks": checks}
    return OrjsonResponse(body, status_code=503)
