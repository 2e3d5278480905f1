"""Request dependencies, declared once as `Annotated` aliases and reused by every route.

`SessionDep` is the unit of work of a request: committed when the route returns and before the
response is sent (scope "function"), so a client is never told 201 about a job whose commit then
failed, and the stage messages go out (after commit) before the client hears back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from polar_mq.api.auth import Authenticator, Principal
from polar_mq.config import Settings
from polar_mq.infra.db import unit_of_work

bearer = HTTPBearer(
    auto_error=False,
    description="An API key from `polar-mq` (not needed while the server has no keys).",
)


def get_session(request: Request) -> Iterator[Session]:
    with unit_of_work(request.app.state.session_factory) as session:
        yield session


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_principal(
    request: Request,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    authenticator: Authenticator = request.app.state.authenticator
    return authenticator.authenticate(session, credentials.credentials if credentials else None)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def get_principal_briefly(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """`get_principal` in a session of its own, closed before the route runs: a long-poll or an
    event stream waits for many seconds and must not hold a pooled connection meanwhile."""
    authenticator: Authenticator = request.app.state.authenticator
    with unit_of_work(request.app.state.session_factory) as session:
        return authenticator.authenticate(session, credentials.credentials if credentials else None)
