"""Dashboard sign-in: the API key in an HttpOnly cookie, checked like a bearer key on every page.

A browser cannot send an `Authorization` header on a page load or an EventSource, so the login
form takes an API key and keeps it in a cookie: HttpOnly (page scripts cannot read it),
SameSite=Strict (no other site can make the browser send it, which is the dashboard's CSRF
defence; its one writing form, a job's cancel button, also checks `same_origin`), limited to
`/ui`, `Secure` on HTTPS. The key itself is stored rather than
a session of our own, so revoking the key signs the browser out at its next request and there is
no second credential to manage.

The rules are the API's: the key's tenant and scopes through the same `Authenticator`, `jobs:read`
needed, a job or rollout of another tenant answered exactly like a missing one (404). While the
server has no keys (local mode) every page is open, as the API is.
"""

from __future__ import annotations

import uuid
from typing import Annotated
from urllib.parse import quote

from fastapi import Depends, Request

from polar_mq.api.auth import Authenticator, Principal
from polar_mq.api.deps import SessionDep
from polar_mq.api.errors import ApiError
from polar_mq.infra.errors import NotFound
from polar_mq.tenants.access import authorize_job, authorize_rollout
from polar_mq.tenants.scopes import JOBS_READ

COOKIE = "polar_mq_ui_key"
COOKIE_PATH = "/ui"
COOKIE_MAX_AGE_S = 12 * 3600


class UiError(Exception):
    """An error page: `status` and a one-line message (rendered as HTML, not JSON)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class LoginRequired(Exception):
    """No valid key: the browser is sent to the login form, then back to `next_url`."""

    def __init__(self, next_url: str, message: str | None = None) -> None:
        super().__init__(message or "sign in")
        self.next_url = next_url
        self.message = message


def safe_next(target: str | None) -> str:
    """A redirect target inside the dashboard (never another site: no open redirect)."""
    if not target or not target.startswith("/ui") or target.startswith("//"):
        return "/ui/"
    if any(c in target for c in "\r\n\\"):
        return "/ui/"
    return target


def login_url(request: Request) -> str:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return f"/ui/login?next={quote(safe_next(here), safe='/')}"


def check_key(request: Request, session: SessionDep, key: str | None) -> Principal:
    """The principal of `key` if it may read jobs; ApiError 401/403 otherwise."""
    authenticator: Authenticator = request.app.state.authenticator
    principal = authenticator.authenticate(session, key)
    if not principal.can(JOBS_READ):
        raise ApiError(403, "forbidden", f"this API key lacks the {JOBS_READ!r} scope")
    return principal


def ui_principal(request: Request, session: SessionDep) -> Principal:
    """The signed-in principal, or LoginRequired (no or bad cookie) / UiError 403 (scope)."""
    key = request.cookies.get(COOKIE)
    try:
        return check_key(request, session, key)
    except ApiError as exc:
        if exc.status == 401:
            message = "your key is no longer valid: sign in again" if key else None
            raise LoginRequired(login_url(request), message) from exc
        raise UiError(exc.status, exc.message) from exc


UiPrincipal = Annotated[Principal, Depends(ui_principal)]


def same_origin(request: Request) -> None:
    """UiError 403 for a form post a browser says another site made.

    The SameSite=Strict cookie already keeps other sites' posts unsigned-in; this is the second
    lock for the dashboard's one writing form (cancel): Fetch Metadata first, else the Origin
    header against this host. A client that sends neither (curl with the cookie) is not a
    browser being tricked."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        if site not in ("same-origin", "none"):
            raise UiError(403, "refused: this form was posted from another site")
        return
    origin = request.headers.get("origin")
    if origin is not None and origin != "null":
        expected = f"{request.url.scheme}://{request.url.netloc}"
        if origin.rstrip("/") != expected:
            raise UiError(403, "refused: this form was posted from another site")
    elif origin == "null":
        raise UiError(403, "refused: this form was posted from another site")


def ui_job(job_id: uuid.UUID, session: SessionDep, principal: UiPrincipal) -> uuid.UUID:
    """The job id of the path, if the principal's tenant may see it (else a 404 page)."""
    try:
        authorize_job(session, job_id, principal.visible_tenant)
    except NotFound as exc:
        raise UiError(404, str(exc)) from exc
    return job_id


def ui_rollout(rollout_id: uuid.UUID, session: SessionDep, principal: UiPrincipal) -> uuid.UUID:
    """The rollout id of the path, if the principal's tenant may see it (else a 404 page)."""
    try:
        authorize_rollout(session, rollout_id, principal.visible_tenant)
    except NotFound as exc:
        raise UiError(404, str(exc)) from exc
    return rollout_id


JobId = Annotated[uuid.UUID, Depends(ui_job)]
RolloutId = Annotated[uuid.UUID, Depends(ui_rollout)]
