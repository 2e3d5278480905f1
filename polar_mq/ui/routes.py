"""The dashboard's routes under `/ui`: sign-in, jobs, a job, a rollout, the system, live streams.

Thin, as every route: check access (`ui.auth`), call one function of `ui.pages` (or a read
service) and render its template. `install_ui` mounts the router, the static files and the
error pages on the API app.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, Path, Query, Request
from fastapi.staticfiles import StaticFiles
from markupsafe import Markup
from sqlalchemy.orm import Session
from starlette.responses import RedirectResponse, Response

from polar_mq.api.deps import SessionDep, SettingsDep
from polar_mq.api.errors import ApiError
from polar_mq.config import Settings
from polar_mq.infra.db import unit_of_work
from polar_mq.infra.errors import NotFound
from polar_mq.lifecycle.cancel import cancel
from polar_mq.models import RolloutStatus
from polar_mq.rollouts import artifact_queries
from polar_mq.tenants.scopes import JOBS_WRITE
from polar_mq.ui import auth, pages, queries
from polar_mq.ui.auth import JobId, RolloutId, UiPrincipal
from polar_mq.ui.call_body import call_body
from polar_mq.ui.compare import compare as compare_view
from polar_mq.ui.live import RenderCache, Rendered, digest, live_stream
from polar_mq.ui.render import STATIC, templates
from polar_mq.ui.search import REASONS, SearchError, parse_query, search
from polar_mq.ui.system import system_view
from polar_mq.ui.tokens_text import TokenDecoder

router = APIRouter(prefix="/ui", include_in_schema=False)
TEMPLATES = templates()
PLAIN_HEADERS = {
    "Content-Security-Policy": "sandbox; default-src 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
"""Agent-controlled text served on its own: inert even if a browser opens it as a page."""
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
Cursor = Annotated[str | None, Query(max_length=500)]
TERMINAL = RolloutStatus.TERMINAL


def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
    response = TEMPLATES.TemplateResponse(request, name, context, status_code=status)
    response.headers.update(SECURITY_HEADERS)
    return response


def fragment(name: str, context: dict[str, Any]) -> str:
    return TEMPLATES.get_template(name).render(context)


def _factory(request: Request) -> Any:
    return request.app.state.session_factory


# ---------------------------------------------------------------------------------------------
# Sign-in


@router.get("/login")
def login_form(
    request: Request,
    next_url: Annotated[str | None, Query(alias="next", max_length=2000)] = None,
) -> Response:
    return page(request, "login.html", {"next": auth.safe_next(next_url), "error": None})


@router.post("/login")
async def login(request: Request) -> Response:
    form = parse_qs((await request.body()).decode("utf-8", errors="replace"))
    key = (form.get("api_key") or [""])[0].strip()
    target = auth.safe_next(form.get("next", [""])[0])
    try:
        with unit_of_work(_factory(request)) as session:
            auth.check_key(request, session, key or None)
    except ApiError as exc:
        context = {"next": target, "error": exc.message}
        return page(request, "login.html", context, status=exc.status)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        auth.COOKIE, key, max_age=auth.COOKIE_MAX_AGE_S, path=auth.COOKIE_PATH, httponly=True,
        samesite="strict", secure=request.url.scheme == "https",
    )  # fmt: skip
    return response


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(auth.COOKIE, path=auth.COOKIE_PATH, httponly=True, samesite="strict")
    return response


# ---------------------------------------------------------------------------------------------
# Jobs


@router.get("")
def ui_root() -> Response:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/")
def jobs(
    request: Request, session: SessionDep, principal: UiPrincipal, cursor: Cursor = None
) -> Response:
    context = pages.jobs_page(session, principal.visible_tenant, cursor)
    context.update(principal=principal, since=digest(_jobs_fingerprint(context)), cursor=cursor)
    return page(request, "jobs.html", context)


def _jobs_fingerprint(context: dict[str, Any]) -> object:
    return [
        (j.summary.job_id, j.summary.state, j.summary.terminal, repr(j.stages), j.n_scored)
        for j in context["jobs"]
    ]


@router.get("/live")
def jobs_live(
    request: Request, principal: UiPrincipal, since: Cursor = None, cursor: Cursor = None
) -> Response:
    tenant = principal.visible_tenant

    def context() -> dict[str, Any]:
        with unit_of_work(_factory(request)) as session:
            return pages.jobs_page(session, tenant, cursor)

    def render(_digest: str) -> Rendered:
        return Rendered(fragment("jobs_live.html", context()), done=False)

    return live_stream(request, lambda: _jobs_fingerprint(context()), render, since)


@router.get("/jobs/{job_id}")
def job(
    request: Request,
    job_id: JobId,
    session: SessionDep,
    principal: UiPrincipal,
    groups: Cursor = None,
) -> Response:
    since = digest(queries.job_fingerprint(session, job_id))
    live = _job_live_part(request, session, job_id, groups, since)
    context = {
        "job_id": job_id, "live_html": Markup(live.html), "done": live.done, "since": since,
        "groups_cursor": groups, "principal": principal,
        "can_cancel": principal.can(JOBS_WRITE) and not live.done,
    }  # fmt: skip
    return page(request, "job.html", context)


@router.post("/jobs/{job_id}/cancel")
def cancel_job(
    request: Request, job_id: JobId, session: SessionDep, principal: UiPrincipal
) -> Response:
    """The job page's cancel button: the API's cancel service, for keys with `jobs:write`.

    A form post is the one thing the dashboard writes, so on top of the SameSite=Strict cookie
    it refuses a request the browser says came from another site (`Sec-Fetch-Site`, `Origin`)."""
    auth.same_origin(request)
    if not principal.can(JOBS_WRITE):
        raise auth.UiError(403, f"this API key lacks the {JOBS_WRITE!r} scope")
    cancel(session, job_id=job_id)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


def _job_live_part(
    request: Request, session: Session, job_id: uuid.UUID, groups: str | None, since: str
) -> Rendered:
    """The job page's live part (rendered by the autoescaping template, hence Markup), from the
    render cache when the job has not changed since it was last rendered."""

    def render() -> Rendered:
        context = pages.job_page(session, job_id, groups)
        status = context["job"]
        return Rendered(fragment("job_live.html", context), status.terminal == status.total)

    cache: RenderCache = request.app.state.ui_cache
    return cache.get_or_render(("job", job_id, groups, since), render)


@router.get("/jobs/{job_id}/live")
def job_live(
    request: Request, job_id: JobId, since: Cursor = None, groups: Cursor = None
) -> Response:
    def fingerprint() -> object:
        with unit_of_work(_factory(request)) as session:
            return queries.job_fingerprint(session, job_id)

    def render(since: str) -> Rendered:
        with unit_of_work(_factory(request)) as session:
            return _job_live_part(request, session, job_id, groups, since)

    return live_stream(request, fingerprint, render, since)


# ---------------------------------------------------------------------------------------------
# Rollouts


@router.get("/rollouts/{rollout_id}")
def rollout(
    request: Request, rollout_id: RolloutId, session: SessionDep, principal: UiPrincipal
) -> Response:
    decoder: TokenDecoder | None = request.app.state.token_decoder
    since = digest(queries.rollout_fingerprint(session, rollout_id))
    context = pages.rollout_page(session, rollout_id, decoder)
    context.update(principal=principal, since=since)
    return page(request, "rollout.html", context)


@router.get("/rollouts/{rollout_id}/live")
def rollout_live(request: Request, rollout_id: RolloutId, since: Cursor = None) -> Response:
    decoder: TokenDecoder | None = request.app.state.token_decoder

    def fingerprint() -> object:
        with unit_of_work(_factory(request)) as session:
            return queries.rollout_fingerprint(session, rollout_id)

    def render(_digest: str) -> Rendered:
        with unit_of_work(_factory(request)) as session:
            context = pages.rollout_page(session, rollout_id, decoder)
        done = context["r"].status in TERMINAL
        return Rendered(fragment("rollout_live.html", context), done)

    return live_stream(request, fingerprint, render, since)


@router.get("/rollouts/{rollout_id}/calls/{call_id}/{part}")
def call_part(
    rollout_id: RolloutId,
    call_id: uuid.UUID,
    part: Annotated[str, Path(max_length=32)],
    session: SessionDep,
) -> Response:
    """One call's request or response as plain text (agent-controlled: never a page)."""
    try:
        text = call_body(session, rollout_id, call_id, part)
    except NotFound as exc:
        raise auth.UiError(404, str(exc)) from exc
    return Response(text, media_type="text/plain; charset=utf-8", headers=PLAIN_HEADERS)


@router.get("/rollouts/{rollout_id}/artifacts/{name:path}")
def artifact(
    rollout_id: RolloutId,
    name: Annotated[str, Path(max_length=128)],
    session: SessionDep,
    attempt: Annotated[int | None, Query(ge=1)] = None,
) -> Response:
    """The artifact as plain text or bytes, never as a page of this site (it is agent output)."""
    content, media_type = artifact_queries.artifact_content(session, rollout_id, name, attempt)
    text = media_type.startswith(pages.TEXT_MEDIA)
    headers = {
        "Content-Security-Policy": "sandbox; default-src 'none'",
        "X-Content-Type-Options": "nosniff",
        "Content-Disposition": "inline" if text else "attachment",
        "Cache-Control": "no-store",
    }
    kind = "text/plain; charset=utf-8" if text else "application/octet-stream"
    return Response(content, media_type=kind, headers=headers)


# ---------------------------------------------------------------------------------------------
# Search and comparison


@router.get("/search")
def search_page(
    request: Request,
    session: SessionDep,
    principal: UiPrincipal,
    q: Annotated[str | None, Query(max_length=1000)] = None,
    status: Annotated[str | None, Query(max_length=100)] = None,
    reason: Annotated[str | None, Query(max_length=100)] = None,
) -> Response:
    context: dict[str, Any] = {"principal": principal, "error": None, "results": None}
    context.update(q=q or "", status=status or "", reason=reason or "", forms=_search_choices())
    try:
        query = parse_query(q, status, reason)
    except SearchError as exc:
        context["error"] = str(exc)
        return page(request, "search.html", context, status=400)
    if not query.empty:
        context["results"] = search(session, query, principal.visible_tenant)
    return page(request, "search.html", context)


def _search_choices() -> dict[str, Any]:
    return {"statuses": RolloutStatus.ALL, "reasons": REASONS}


@router.get("/compare")
def compare(
    request: Request,
    session: SessionDep,
    principal: UiPrincipal,
    jobs: Annotated[list[uuid.UUID] | None, Query(max_length=50)] = None,
) -> Response:
    context = compare_view(session, jobs or [], principal.visible_tenant)
    context["principal"] = principal
    return page(request, "compare.html", context)


# ---------------------------------------------------------------------------------------------
# System


@router.get("/system")
def system(
    request: Request, session: SessionDep, settings: SettingsDep, principal: UiPrincipal
) -> Response:
    view = system_view(session, settings)
    return page(request, "system.html", {"view": view, "principal": principal})


# ---------------------------------------------------------------------------------------------
# Mounting


def _error_page(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, auth.UiError)
    context = {"status": exc.status, "message": exc.message, "principal": None}
    return page(request, "error.html", context, status=exc.status)


def _to_login(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, auth.LoginRequired)
    return RedirectResponse(exc.next_url, status_code=303)


def install_ui(app: FastAPI, settings: Settings) -> None:
    """Mount the dashboard on the API app (routes, static files, error pages, token decoder)."""
    handlers: dict[type[Exception], Callable[[Request, Exception], Response]] = {
        auth.UiError: _error_page,
        auth.LoginRequired: _to_login,
    }
    for kind, handler in handlers.items():
        app.add_exception_handler(kind, handler)
    upstream = (settings.upstream_urls or [settings.upstream_url])[0]
    app.state.token_decoder = TokenDecoder(upstream, settings.served_model)
    app.state.ui_cache = RenderCache()
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
