"""The API app factory: one FastAPI app per process, its resources opened in the lifespan.

The database engine and the Celery app (the default publisher) are created when the app starts and
closed when it stops; they live on `app.state`, never in module globals. Tests inject a session
factory and an in-memory publisher instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.api.auth import Authenticator
from polar_mq.api.body_limit import BodyLimitMiddleware
from polar_mq.api.broker_gate import BrokerGate
from polar_mq.api.errors import body_timeout_response, install_error_handlers
from polar_mq.api.routes import cancel, groups, health, jobs, policy, rollouts
from polar_mq.api.schemas import EVERY_OPERATION, error_responses
from polar_mq.config import Settings
from polar_mq.dispatch.celery_app import PolarCelery, create_celery, publish_messages
from polar_mq.infra.body_timeout import BodyTimeoutMiddleware
from polar_mq.infra.db import create_db_engine, make_session_factory
from polar_mq.infra.imports import AllowlistMiddleware
from polar_mq.lifecycle.messages import StageMessage
from polar_mq.lifecycle.outbox import Publisher, attach_publisher
from polar_mq.observability.api_logs import install_request_context
from polar_mq.observability.api_metrics import install_metrics


def _version() -> str:
    try:
        return version("polar-mq")
    except PackageNotFoundError:
        return "0+unknown"


def create_api(
    settings: Settings,
    *,
    session_factory: sessionmaker[Session] | None = None,
    publisher: Publisher | None = None,
) -> FastAPI:
    """Build the REST API (without the dashboard: `polar_mq.ui.app.create_app` adds it).

    `session_factory`: sessions on an existing engine (default: an engine on
    `settings.database_url`, opened in the lifespan); the app attaches its publisher to it, so
    give each app its own factory. `publisher`: sends stage messages after commit (default:
    Celery on `settings.broker_url`).
    """

    def publish_via_state(messages: Sequence[StageMessage]) -> None:
        # Resolved per call: the publisher is (re)created by each run of the lifespan.
        app.state.publisher(messages)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine: Engine | None = None
        celery: PolarCelery | None = None
        factory = session_factory
        if factory is None:
            engine = create_db_engine(settings.database_url)
            factory = make_session_factory(engine)
            attach_publisher(factory, publish_via_state)
        publish = publisher
        if publish is None:
            celery = create_celery(settings)
            publish = partial(publish_messages, celery)
        app.state.session_factory = factory
        app.state.publisher = publish
        app.state.broker_gate = BrokerGate(settings.broker_url) if publisher is None else None
        try:
            yield
        finally:
            if celery is not None:
                celery.close()
            if engine is not None:
                engine.dispose()

    app = FastAPI(
        title="polar_mq",
        version=_version(),
        summary="Rollout-as-a-service for agentic RL",
        lifespan=lifespan,
        responses=error_responses(*EVERY_OPERATION),
    )
    app.state.settings = settings
    app.state.authenticator = Authenticator()
    if session_factory is not None:
        attach_publisher(session_factory, publish_via_state)
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AllowlistMiddleware, prefixes=settings.import_allowlist)
    app.add_middleware(
        BodyTimeoutMiddleware, timeout_s=settings.body_read_timeout_s, refuse=body_timeout_response
    )
    install_metrics(app, settings.metrics_cache_s)  # outermost: every request is counted
    install_request_context(app)  # before the routers: their lines name the job or rollout
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(rollouts.router)
    app.include_router(cancel.router)
    app.include_router(groups.router)
    app.include_router(policy.router)
    return app
