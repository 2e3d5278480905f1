"""The API's `GET /metrics`: HTTP requests by route, and rollouts and jobs by state.

Requests are counted by a plain ASGI middleware, labelled with the route's template
(`/v1/jobs/{job_id}`, never the concrete path: one series per route, not per job); a request no
route matched is `(unmatched)`. Rollouts by status and jobs by state are counted in PostgreSQL
when Prometheus scrapes, at most once per `metrics_cache_s` (several API replicas or a fast
scrape interval cost one pair of queries per period), so they are the same numbers the status
endpoints report; the reward and learning-signal metrics (`reward_metrics`) likewise, at most
once per REWARD_CACHE_FACTOR periods. A database that cannot be read leaves those families out
and sets `polar_api_db_up` to 0; the request counters are still served.

Every app has its own `CollectorRegistry` (tests build many apps in one process). As the
proxy's, this `/metrics` needs no key: it shows aggregate counts only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from polar_mq.jobs.job_state import JOB_STATES, job_states_by_count
from polar_mq.models import Rollout, RolloutStatus
from polar_mq.observability.reward_metrics import RewardCollector

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
UNMATCHED = "(unmatched)"
REWARD_CACHE_FACTOR = 3
"""The reward and group metrics (a GROUP BY over every group) are read this many times less
often than the state counts."""
FactorySource = Callable[[], "sessionmaker[Session] | None"]


@dataclass(frozen=True, slots=True)
class StateCounts:
    rollouts: dict[str, int]
    jobs: dict[str, int]


def count_states(session: Session) -> StateCounts:
    """Rollouts by status and jobs by state (`jobs.job_state`'s rule, in SQL), two queries."""
    rollouts = dict.fromkeys(RolloutStatus.ALL, 0)
    for status, count in session.execute(
        select(Rollout.status, func.count()).group_by(Rollout.status)
    ).tuples():
        rollouts[status] = int(count)
    jobs: dict[str, int] = dict.fromkeys(JOB_STATES, 0)
    for name, count in session.execute(job_states_by_count()).tuples():
        jobs[str(name)] = int(count)
    return StateCounts(rollouts, jobs)


class DbStateCollector(Collector):
    """`polar_rollouts{status}`, `polar_jobs{state}` and `polar_api_db_up`, cached."""

    def __init__(self, factory: FactorySource, cache_s: float) -> None:
        self._factory = factory
        self._cache_s = cache_s
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._counts: StateCounts | None = None

    def counts(self) -> StateCounts | None:
        with self._lock:  # one reader per period, even with concurrent scrapes
            now = time.monotonic()
            if now - self._read_at >= self._cache_s:
                self._counts = self._read()
                self._read_at = now
            return self._counts

    def _read(self) -> StateCounts | None:
        factory = self._factory()
        if factory is None:  # the app has not started yet
            return None
        try:
            with factory() as session:
                return count_states(session)
        except Exception as exc:
            log.warning("metrics: cannot count rollouts and jobs: %s", exc)
            return None

    def collect(self) -> Iterator[Metric]:
        counts = self.counts()
        yield GaugeMetricFamily(
            "polar_api_db_up",
            "Whether the last count of rollouts and jobs could read the database",
            value=0 if counts is None else 1,
        )
        if counts is None:
            return
        rollouts = GaugeMetricFamily("polar_rollouts", "Rollouts by status", labels=["status"])
        for status, count in counts.rollouts.items():
            rollouts.add_metric([status], count)
        yield rollouts
        jobs = GaugeMetricFamily("polar_jobs", "Jobs by state", labels=["state"])
        for state, count in counts.jobs.items():
            jobs.add_metric([state], count)
        yield jobs


class ApiMetrics:
    """One API app's registry: the request metrics and the database counts."""

    def __init__(self, factory: FactorySource, cache_s: float = 5.0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "polar_api_requests",
            "API requests by method, route template and HTTP status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "polar_api_request_duration_seconds",
            "API request handling time by method and route template",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.states = DbStateCollector(factory, cache_s)
        self.registry.register(self.states)
        self.rewards = RewardCollector(factory, cache_s * REWARD_CACHE_FACTOR)
        self.registry.register(self.rewards)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestMetricsMiddleware:
    """Counts every HTTP request under its route template (outermost, so refusals count too)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception before any response is a 500 to the client

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.observe(
                scope.get("method", "GET"), route_of(scope), status, time.perf_counter() - started
            )


def route_of(scope: Scope) -> str:
    """The template of the route that served `scope`, or `(unmatched)`."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str) and path:
        return path
    if "app_root_path" in scope:  # inside a mount (the dashboard's static files)
        mounted = str(scope.get("root_path", "")).removeprefix(str(scope["app_root_path"]))
        if mounted:
            return f"{mounted}/*"
    return UNMATCHED


async def metrics_endpoint(request: Request) -> Response:
    """`GET /metrics`, in the Prometheus text format."""
    metrics: ApiMetrics = request.app.state.metrics
    return Response(metrics.render(), 200, media_type=CONTENT_TYPE_LATEST)


def install_metrics(app: object, cache_s: float) -> ApiMetrics:
    """Add the middleware and the `/metrics` route to a FastAPI app (its `state.metrics`)."""
    from fastapi import FastAPI

    assert isinstance(app, FastAPI)
    metrics = ApiMetrics(lambda: getattr(app.state, "session_factory", None), cache_s)
    app.state.metrics = metrics
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
    app.add_route("/metrics", metrics_endpoint, methods=["GET"], include_in_schema=False)
    return metrics
