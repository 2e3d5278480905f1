"""Group routes: lease complete groups, acknowledge them, extend leases, or follow an event stream.

The service is `polar_mq.jobs.deliveries` (atomic claims, acks, redelivery). Waiting is done here,
in the event loop: each look is one short unit of work run in the threadpool, then an
`asyncio.sleep` of `settings.group_poll_s`, so a thousand waiting trainers hold no database
connection and no thread between looks. Authentication uses its own short session for the same
reason (`get_principal_briefly`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query, Request
from sqlalchemy.exc import OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response, StreamingResponse

from polar_mq.api.access import job_access_briefly
from polar_mq.api.deps import SessionDep, get_principal_briefly
from polar_mq.api.responses import OrjsonResponse
from polar_mq.api.schemas import (
    CONSUMER_PATTERN,
    MAX_LEASE_S,
    DeliveriesRequest,
    ExtendRequest,
    LeaseRequest,
    error_responses,
)
from polar_mq.infra.db import unit_of_work
from polar_mq.jobs import deliveries
from polar_mq.jobs.read_models import AckResult, ExtendResult, GroupLease
from polar_mq.tenants.scopes import JOBS_READ

log = logging.getLogger(__name__)
router = APIRouter(
    prefix="/v1/jobs",
    tags=["groups"],
    dependencies=[Depends(get_principal_briefly), Depends(job_access_briefly(JOBS_READ))],
    responses=error_responses(401, 403, 404, 422, 503),
)
"""Leasing, acknowledging and streaming groups is how a trainer reads results, so `jobs:read` is
enough; the job must be the key's tenant's (checked before any wait or event)."""


def _lease_once(request: Request, job_id: uuid.UUID, body: LeaseRequest) -> GroupLease:
    with unit_of_work(request.app.state.session_factory) as session:
        return deliveries.lease_groups(
            session, job_id, body.consumer, body.max_groups, body.lease_s,
            max_in_flight=body.max_in_flight, include_trajectories=body.include_trajectories,
            advantages=body.advantages,
        )  # fmt: skip


@router.post(
    "/{job_id}/groups/lease",
    response_model=GroupLease,
    responses={
        204: {"description": "The trainer disconnected during the long-poll: nothing leased"},
        **error_responses(400),
    },
)
async def lease_groups(job_id: uuid.UUID, body: LeaseRequest, request: Request) -> Response:
    """Lease complete groups in completion order; long-polls up to `wait_s` for the first one.

    Each group carries a `delivery`; acknowledge it with `groups/ack` before `lease_expires_at`,
    or it is handed out again (`delivery_count` + 1, `redelivered`). `done` says the job is
    finished and every group acknowledged: stop leasing.
    """
    poll_s: float = request.app.state.settings.group_poll_s
    deadline = time.monotonic() + body.wait_s
    while True:
        lease = await run_in_threadpool(_lease_once, request, job_id, body)
        left = deadline - time.monotonic()
        if lease.groups or lease.done or left <= 0:
            return OrjsonResponse(lease)
        await asyncio.sleep(min(poll_s, left))
        if await request.is_disconnected():  # lease nothing to a trainer that went away
            return Response(status_code=204)


@router.post(
    "/{job_id}/groups/ack", response_model=AckResult, responses=error_responses(400, 404, 409)
)
def ack_groups(job_id: uuid.UUID, body: DeliveriesRequest, session: SessionDep) -> Response:
    """Acknowledge deliveries (all or nothing): their groups are never handed out again.

    Idempotent for the consumer that holds them. 404 `unknown_delivery`: never handed out;
    409 `delivery_superseded`: the lease expired and the group went to another consumer;
    409 `not_your_delivery`: leased to another consumer.
    """
    result = deliveries.ack_groups(session, job_id, body.consumer, body.delivery_ids)
    return OrjsonResponse(result)


@router.post(
    "/{job_id}/groups/extend", response_model=ExtendResult, responses=error_responses(400, 404, 409)
)
def extend_leases(job_id: uuid.UUID, body: ExtendRequest, session: SessionDep) -> Response:
    """Push the leases of unacked deliveries to now + `lease_s` (all or nothing).

    Errors as for ack, plus 409 `already_acked`.
    """
    result = deliveries.extend_leases(
        session, job_id, body.consumer, body.delivery_ids, body.lease_s
    )
    return OrjsonResponse(result)


def _event(kind: str, data: Any, event_id: str | None = None) -> bytes:
    head = f"event: {kind}\n" + (f"id: {event_id}\n" if event_id else "")
    return head.encode() + b"data: " + orjson.dumps(data) + b"\n\n"


def _event_schema(event: str, data_model: str, *, with_id: bool) -> dict[str, Any]:
    """One kind of event of the stream as OpenAPI 3.1 describes an `text/event-stream` item: the
    fields of the event, its `data` a JSON document of `data_model`."""
    properties: dict[str, Any] = {
        "event": {"const": event},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {"$ref": f"#/components/schemas/{data_model}"},
        },
    }
    if with_id:
        properties["id"] = {"type": "string", "description": "the delivery id"}
    required = ["event", "data", *(["id"] if with_id else [])]
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}  # fmt: skip


STREAM_EVENT_SCHEMA = {
    "oneOf": [
        _event_schema("group", "DeliveredGroup", with_id=True),
        _event_schema("end", "GroupLease", with_id=False),
    ]
}
"""Each event of the group stream (the comment lines sent as heartbeats are not events)."""


@router.get(
    "/{job_id}/groups/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Server-sent events: `group` (data: a leased group with its "
            "`delivery`; id: the delivery id), `end` (data: the final lease counters), and "
            "comment lines as heartbeats while waiting",
            "content": {"text/event-stream": {"schema": STREAM_EVENT_SCHEMA}},
        }
    },
)
async def stream_groups(
    job_id: uuid.UUID,
    request: Request,
    consumer: Annotated[str, Query(min_length=1, max_length=200, pattern=CONSUMER_PATTERN)],
    lease_s: Annotated[float, Query(gt=0, le=MAX_LEASE_S)] = 60.0,
    max_in_flight: Annotated[
        int | None, Query(ge=1, description="hold back while this many sent groups are unacked")
    ] = None,
    include_trajectories: bool = False,
    advantages: Literal["grpo"] | None = None,
    heartbeat_s: Annotated[float, Query(gt=0, le=300)] = 15.0,
) -> StreamingResponse:
    """Each complete group as it completes, leased to `consumer`, one `group` event each.

    Acknowledge with `POST groups/ack` as for leases. The stream ends with an `end` event once the
    job is finished and every group is acknowledged; groups sent but not acknowledged are sent
    again (here or to another consumer) when their lease expires, so the stream stays open until
    then. Closing the stream leaves unacked groups to expire.
    """
    body = LeaseRequest(
        consumer=consumer, max_groups=100, lease_s=lease_s, max_in_flight=max_in_flight,
        include_trajectories=include_trajectories, advantages=advantages,
    )  # fmt: skip
    poll_s: float = request.app.state.settings.group_poll_s

    async def events() -> AsyncIterator[bytes]:
        yield b": stream open\n\n"
        quiet_since = time.monotonic()
        while not await request.is_disconnected():
            try:
                lease = await run_in_threadpool(_lease_once, request, job_id, body)
            except OperationalError as exc:  # keep the stream; the database may come back
                log.warning("group stream of job %s: database unavailable: %s", job_id, exc)
                yield b": database unavailable, retrying\n\n"
                await asyncio.sleep(max(poll_s, 1.0))
                continue
            for group in lease.groups:
                yield _event("group", group, group.delivery.delivery_id)
            if lease.done:
                yield _event("end", lease)
                return
            if lease.groups:
                quiet_since = time.monotonic()
                continue
            if time.monotonic() - quiet_since >= heartbeat_s:
                yield b": heartbeat\n\n"
                quiet_since = time.monotonic()
            await asyncio.sleep(poll_s)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
