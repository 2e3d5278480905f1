"""The proxy app factory: one backend pool (pooled clients) and one call writer per process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx
from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from polar_mq.config import Settings
from polar_mq.infra.body_timeout import BodyReadTimeout, BodyTimeoutMiddleware
from polar_mq.infra.db import create_db_engine
from polar_mq.proxy.apis.registry import family_routes
from polar_mq.proxy.backends import BackendPool, HealthChecker
from polar_mq.proxy.backends.admin import CHANGES, admin_routes
from polar_mq.proxy.engines import get_engine
from polar_mq.proxy.engines.base import RETOKENIZED
from polar_mq.proxy.engines.retokenize import RetokenizingSink
from polar_mq.proxy.errors import request_timeout
from polar_mq.proxy.metrics import ProxyMetrics, metrics_endpoint
from polar_mq.proxy.policy_sync import PolicySync, db_reader
from polar_mq.proxy.rollout_states import RolloutStates, StateReader, db_state_reader
from polar_mq.proxy.server import routes
from polar_mq.proxy.server.auth import RolloutAuth
from polar_mq.proxy.server.fanout import Siblings, fanned_out, flushed, replay
from polar_mq.proxy.server.fast_path import FastPathApp
from polar_mq.proxy.server.state import ProxyState
from polar_mq.proxy.store.call_log import CallLogSink
from polar_mq.proxy.store.receipts import HurryListener, StartCounter
from polar_mq.proxy.store.seq import SeqFloor, sequencer, unknown_floor
from polar_mq.proxy.store.seq_floor import db_seq_floor, spilled_rows
from polar_mq.proxy.store.writer import CallSink, DbCallWriter
from polar_mq.proxy.tito import Tito, tito_enabled
from polar_mq.proxy.token_budget import (
    BudgetedSink,
    TokenBudgets,
    db_budget_reader,
    processed_rows,
)
from polar_mq.proxy.tokenize import tokenize_routes

if TYPE_CHECKING:
    from polar_mq.proxy.server.worker_slot import WorkerSlot


def create_proxy_app(
    settings: Settings,
    *,
    upstream_transport: httpx.AsyncBaseTransport | None = None,
    sink: CallSink | None = None,
    rollout_states: StateReader | None = None,
    worker: WorkerSlot | None = None,
) -> Starlette:
    """The proxy as an ASGI app.

    `upstream_transport` replaces the network of every backend (tests pass
    `httpx.ASGITransport(fake_app)`); `sink` replaces the database writer (default: a
    `DbCallWriter` on `settings.database_url`). The app owns whichever sink it uses: it starts it
    at startup and drains and closes it at shutdown. The backends (`settings.upstream_urls`, or
    `upstream_url`) are health-checked in the background while the app runs.

    Calls of rollouts that ended or do not exist are refused (`rollout_states`): the states are
    read from the database when the proxy writes there itself; `rollout_states` replaces that
    reader (tests); with an injected sink and no reader they are not checked.

    `worker`: this is one process of a `--workers N` proxy; its admin calls reach its siblings,
    and once started it replays the admin changes they journaled (it was restarted).
    """
    engine = get_engine(settings.upstream_engine)
    tito_enabled(settings)  # a TITO setting the engine cannot honour is refused at boot

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        pool = BackendPool.from_settings(settings, routes.FORWARDED_PATHS, upstream_transport)
        health = HealthChecker(pool, settings.health_interval_s, settings.health_timeout_s)
        health.start()
        receipts_url = settings.call_receipts_redis_url
        budgets: TokenBudgets | None = None
        stored_sink = sink if sink is not None else DbCallWriter.from_settings(settings, worker)
        # Budgets count the rows with their token ids, so inside the retokenizing sink.
        call_sink: CallSink = BudgetedSink(stored_sink, lambda: budgets)
        retokenizer: RetokenizingSink | None = None
        if engine.FIDELITY == RETOKENIZED:  # ids from the backend's /tokenize, after the call
            call_sink = retokenizer = RetokenizingSink(call_sink, pool.get)
        call_sink = CallLogSink(call_sink)  # a log line per call, with its rollout
        await call_sink.start()
        policy: PolicySync | None = None
        policy_engine: Engine | None = None
        state_reader = rollout_states
        if sink is None:  # the proxy talks to the database: follow the recorded policy too
            policy_engine = _reads_engine(settings.database_url)
            policy = PolicySync(pool, db_reader(policy_engine), settings.policy_sync_s)
            await policy.start()
            state_reader = state_reader or db_state_reader(policy_engine)
            budgets = TokenBudgets(
                db_budget_reader(policy_engine),
                settings.proxy_rollout_state_ttl_s,
                lambda: processed_rows(stored_sink.stats()),
            )
        seq_floor: SeqFloor = unknown_floor
        if policy_engine is not None:  # a counter that forgets an attempt goes on from its rows
            seq_floor = db_seq_floor(policy_engine, lambda: spilled_rows(stored_sink.stats()))
        rollouts = None
        if state_reader is not None:
            rollouts = RolloutStates(state_reader, settings.proxy_rollout_state_ttl_s)
            await rollouts.start()
        app.state.proxy = ProxyState(
            backends=pool,
            sink=call_sink,
            auth=RolloutAuth(settings.secret_key),
            seqs=sequencer(settings, seq_floor),
            served_model=settings.served_model,
            max_body_bytes=settings.max_body_bytes,
            admin_token=settings.proxy_admin_token,
            durable_answers=settings.proxy_durable_answers,
            engine=engine,
            metrics=ProxyMetrics(call_sink.stats),
            rollouts=rollouts,
            budgets=budgets,
            siblings=Siblings(worker) if worker is not None else None,
            body_read_timeout_s=settings.body_read_timeout_s,
            receipts=(
                StartCounter.from_url(receipts_url, settings.proxy_redis_retry_s)
                if receipts_url
                else None
            ),
        )
        app.state.proxy.tito = Tito.from_settings(settings)
        hurry = None
        if receipts_url and isinstance(stored_sink, DbCallWriter):
            hurry = HurryListener(receipts_url, stored_sink.hurry)
            hurry.start()
        if worker is not None:
            await replay(app, worker, CHANGES)
        try:
            yield
        finally:
            if app.state.proxy.siblings is not None:
                await app.state.proxy.siblings.aclose()
            await app.state.proxy.seqs.aclose()
            if app.state.proxy.tito is not None:
                await app.state.proxy.tito.aclose()
            if app.state.proxy.receipts is not None:
                await app.state.proxy.receipts.aclose()
            if hurry is not None:
                await hurry.stop()
            if rollouts is not None:
                await rollouts.stop()
            if policy is not None:
                await policy.stop()
            if policy_engine is not None:
                policy_engine.dispose()
            await health.stop()
            if retokenizer is not None:  # its lookups need the backends' clients: closed first,
                await retokenizer.drain()  # they failed and the calls lost their ids
            await pool.aclose()
            await call_sink.close()

    api = [
        ("/v1/chat/completions", routes.chat_completions, "POST"),
        ("/v1/completions", routes.completions, "POST"),
        ("/v1/models", routes.models, "GET"),
        *[(path, fn, "POST") for path, fn in tokenize_routes()],
        *family_routes(),
        ("/", routes.root, "GET"),
    ]
    app_routes = [Route(path, fn, methods=[method]) for path, fn, method in api]
    app_routes += [
        Route("/r/{token}" + path.rstrip("/"), fn, methods=[method]) for path, fn, method in api
    ]
    app_routes += [
        Route("/healthz", routes.healthz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route(
            "/admin/flush", fanned_out(routes.admin_flush, flushed, journal=False), methods=["POST"]
        ),
        *admin_routes(),
    ]
    timeout = Middleware(
        BodyTimeoutMiddleware, timeout_s=settings.body_read_timeout_s, refuse=_timed_out
    )
    return FastPathApp(
        hot={path: fn for path, fn, method in api if method == "POST" and "{" not in path},
        routes=app_routes,
        lifespan=lifespan,
        middleware=[timeout],
        exception_handlers={BodyReadTimeout: _body_timeout},  # bodies read outside body.py
    )


def _reads_engine(url: str) -> Engine:
    """The engine of the proxy's reads: the policy state, rollout states and token budgets.

    Each read is one statement (or several that need no common snapshot), so on PostgreSQL they
    run in autocommit: no BEGIN before the read and no ROLLBACK when its connection goes back to
    the pool, two round trips of four with the pre-ping, on every new rollout's first call."""
    extra: dict[str, Any] = (
        {"isolation_level": "AUTOCOMMIT"} if url.startswith("postgresql") else {}
    )
    return create_db_engine(url, pool_size=2, max_overflow=0, **extra)


def _timed_out(exc: BodyReadTimeout) -> Response:
    return request_timeout(exc.message)


async def _body_timeout(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BodyReadTimeout)
    return _timed_out(exc)
