"""The API process's app: the REST API with the dashboard mounted on it.

Composed here, above both packages: the dashboard builds on the API's authentication, sessions and
error shapes, so the API package cannot import it without a cycle.
"""

from __future__ import annotations

from fastapi import FastAPI
from sqlalchemy.orm import Session, sessionmaker
from starlette.responses import RedirectResponse

from polar_mq.api.app import create_api
from polar_mq.config import Settings
from polar_mq.lifecycle.outbox import Publisher
from polar_mq.ui import install_ui

UI_HOME = "/ui/"
"""Where `GET /` sends a browser: the dashboard's home (`polar_mq.ui.routes`, prefix /ui)."""


def create_app(
    settings: Settings,
    *,
    session_factory: sessionmaker[Session] | None = None,
    publisher: Publisher | None = None,
) -> FastAPI:
    """The REST API (`polar_mq.api.create_api`, same arguments) plus the dashboard under /ui."""
    app = create_api(settings, session_factory=session_factory, publisher=publisher)
    install_ui(app, settings)
    app.add_api_route("/", _to_dashboard, methods=["GET"], include_in_schema=False)
    return app


def _to_dashboard() -> RedirectResponse:
    """`GET /`: a person who opens the API's address in a browser lands on the dashboard
    (which sends them on to sign in), not on a 404."""
    return RedirectResponse(UI_HOME, status_code=307)
