"""Access rules of the routes, as dependencies: a scope, and for routes that name a job or a
rollout, ownership by the caller's tenant.

Every `/v1` route declares one of these (tests/security checks that none is missing). They run
after the router's authentication dependency, so a stranger still gets a 401 before anything else;
then a missing scope is a 403, and a job or rollout of another tenant a 404 indistinguishable from
one that does not exist. The `_briefly` variants use a short session of their own, for the routes
that wait (long-polls, event streams) and must not hold a pooled connection.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import cache, partial
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from polar_mq.api.auth import Principal
from polar_mq.api.deps import SessionDep, get_principal, get_principal_briefly
from polar_mq.api.errors import ApiError
from polar_mq.infra.db import unit_of_work
from polar_mq.tenants.access import authorize_job, authorize_rollout

PrincipalOf = Callable[..., Principal]
"""The factories below are cached: the same rule is the same callable, so FastAPI runs it once per
request even when a route names it twice (in `dependencies` to order it, and as a parameter)."""


def check_scope(principal: Principal, scope: str) -> None:
    """Raise a 403 unless the principal holds `scope` (or `admin`)."""
    if not principal.can(scope):
        held = ", ".join(sorted(principal.scopes)) or "none"
        raise ApiError(
            403,
            "forbidden",
            f"this API key lacks the {scope!r} scope (it has: {held})",
        )


Authenticated = Annotated[Principal, Depends(get_principal)]
AuthenticatedBriefly = Annotated[Principal, Depends(get_principal_briefly)]
"""The caller, authenticated in the request's session or in a short one of its own."""


def _allowed(
    principal: Principal, scope: str, owns: Callable[[str | None], None] | None = None
) -> Principal:
    """The principal, once it holds `scope` and (`owns`, given its visible tenant) owns what the
    path names; the one body of every rule below, which differ only in what FastAPI injects."""
    check_scope(principal, scope)
    if owns is not None:
        owns(principal.visible_tenant)
    return principal


@cache
def require(scope: str) -> PrincipalOf:
    """The request's principal, which must hold `scope`."""

    def dependency(principal: Authenticated) -> Principal:
        return _allowed(principal, scope)

    return dependency


@cache
def require_briefly(scope: str) -> PrincipalOf:
    """`require` with authentication in a short session of its own."""

    def dependency(principal: AuthenticatedBriefly) -> Principal:
        return _allowed(principal, scope)

    return dependency


@cache
def job_access(scope: str) -> PrincipalOf:
    """`require(scope)`, and the `{job_id}` of the path must be the caller's tenant's (else 404)."""

    def dependency(job_id: uuid.UUID, session: SessionDep, principal: Authenticated) -> Principal:
        return _allowed(principal, scope, partial(authorize_job, session, job_id))

    return dependency


@cache
def job_access_briefly(scope: str) -> PrincipalOf:
    """`job_access` in a short session of its own."""

    def dependency(
        job_id: uuid.UUID, request: Request, principal: AuthenticatedBriefly
    ) -> Principal:
        return _allowed(principal, scope, partial(_briefly, request, authorize_job, job_id))

    return dependency


@cache
def rollout_access(scope: str) -> PrincipalOf:
    """`require(scope)`, and the `{rollout_id}` of the path must be the caller's tenant's."""

    def dependency(
        rollout_id: uuid.UUID, session: SessionDep, principal: Authenticated
    ) -> Principal:
        return _allowed(principal, scope, partial(authorize_rollout, session, rollout_id))

    return dependency


def _briefly(
    request: Request,
    authorize: Callable[[Session, uuid.UUID, str | None], object],
    owned_id: uuid.UUID,
    tenant: str | None,
) -> None:
    with unit_of_work(request.app.state.session_factory) as session:
        authorize(session, owned_id, tenant)
