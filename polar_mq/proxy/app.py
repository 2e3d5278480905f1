"""The proxy app factory: one pooled upstream client and one call writer per process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from starlette.applications import Starlette
from starlette.routing import Route

from polar_mq.config import Settings
from polar_mq.proxy import routes
from polar_mq.proxy.auth import RolloutAuth
from polar_mq.proxy.engines import check_engine
from polar_mq.proxy.record import SeqCounter
from polar_mq.proxy.state import ProxyState
from polar_mq.proxy.writer import CallSink, DbCallWriter

UPSTREAM_LIMITS = httpx.Limits(max_connections=4096, max_keepalive_connections=1024)
UPSTREAM_TIMEOUT = httpx.Timeout(connect=10.0, read=1800.0, write=60.0, pool=None)
"""No pool timeout (calls queue for a connection); a generous read timeout for long generations."""


def upstream_base_url(url: str) -> str:
    """The engine's root URL; a trailing `/v1` (as in OpenAI base URLs) is tolerated."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def create_proxy_app(
    settings: Settings,
    *,
    upstream_transport: httpx.AsyncBaseTransport | None = None,
    sink: CallSink | None = None,
) -> Starlette:
    """The proxy as an ASGI app.

    `upstream_transport` replaces the network (tests pass `httpx.ASGITransport(fake_app)`); `sink`
    replaces the database writer (default: a `DbCallWriter` on `settings.database_url`). The app
    owns whichever sink it uses: it starts it at startup and drains and closes it at shutdown.
    """
    check_engine(settings.upstream_engine)
    backend = upstream_base_url(settings.upstream_url)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        transport = upstream_transport or httpx.AsyncHTTPTransport(
            limits=UPSTREAM_LIMITS, trust_env=False
        )
        client = httpx.AsyncClient(
            base_url=backend, transport=transport, timeout=UPSTREAM_TIMEOUT, trust_env=False
        )
        call_sink = sink if sink is not None else DbCallWriter.from_settings(settings)
        await call_sink.start()
        app.state.proxy = ProxyState(
            client=client,
            transport=transport,
            timeouts={"timeout": UPSTREAM_TIMEOUT.as_dict()},
            urls={path: httpx.URL(backend + path) for path in routes.FORWARDED_PATHS},
            sink=call_sink,
            auth=RolloutAuth(settings.secret_key),
            seqs=SeqCounter(),
            backend=backend,
            served_model=settings.served_model,
            max_body_bytes=settings.max_body_bytes,
            admin_token=settings.proxy_admin_token,
        )
        try:
            yield
        finally:
            await client.aclose()
            await call_sink.close()

    api = [
        ("/v1/chat/completions", routes.chat_completions, "POST"),
        ("/v1/completions", routes.completions, "POST"),
        ("/v1/models", routes.models, "GET"),
    ]
    app_routes = [Route(path, fn, methods=[method]) for path, fn, method in api]
    app_routes += [Route("/r/{token}" + path, fn, methods=[method]) for path, fn, method in api]
    app_routes += [
        Route("/healthz", routes.healthz, methods=["GET"]),
        Route("/admin/flush", routes.admin_flush, methods=["POST"]),
    ]
    return Starlette(routes=app_routes, lifespan=lifespan)
