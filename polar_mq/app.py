"""The API process's app: the REST API with the dashboard mounted on it.

Composed here, above both packages: the dashboard builds on the API's authentication, sessions and
error shapes, so the API package cannot import it without a cycle.
"""

from __future__ import annotations

from fastapi import FastAPI
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.api.app import create_api
from polar_mq.config import Settings
from polar_mq.lifecycle.outbox import Publisher
from polar_mq.ui import install_ui


def create_app(
    settings: Settings,
    *,
    session_factory: sessionmaker[Session] | None = None,
    publisher: Publisher | None = None,
) -> FastAPI:
    """The REST API (`polar_mq.api.create_api`, same arguments) plus the dashboard under /ui."""
    app = create_api(settings, session_factory=session_factory, publisher=publisher)
    install_ui(app, settings)
    return app
