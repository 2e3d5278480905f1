"""Prometheus metrics of one proxy app, served at `GET /metrics`.

The request path must stay cheap (SPEC §9: <= 250 us of proxy CPU per call), and
prometheus-client's own `Counter`/`Histogram` take a lock and check exemplars on every update.
The proxy runs on one event-loop thread, so `observe` just adds to plain numbers (a dict
lookup, integer adds, one `bisect` per histogram) and a collector turns them into metric
families when Prometheus scrapes. Every app has its own `CollectorRegistry` (tests build many apps
in one process). The call sink's
counters (queue depth, spill size, drops) are read from `sink.stats()` at scrape time, so the
writer does no metrics work at all; unknown numeric keys are exported too, missing ones skipped.

Requests and errors count every generation call, including those refused before forwarding
(401, 400, 413, a paused backend's 503): those have no latency and no logged row.

`/metrics` needs no token: Prometheus scrapes without the rollouts' capability tokens, and what it
shows is aggregate counts (no rollout ids, prompts or tokens). Keep the proxy port off the public
network, as for vLLM's own `/metrics`.

Latency definitions (seconds):
- `polar_proxy_added_latency_seconds`: the proxy's own share of a call. Non-streaming: from the
  agent's body being read to our response being ready, minus the upstream exchange. Streaming
  (`stream="true"`): the proxy's time before the upstream request went out (reading, rewriting,
  routing), i.e. what it adds to the time to first token; per-chunk relaying is not included.
- `polar_proxy_upstream_seconds`: the upstream exchange (non-streaming), or the whole stream.
- `polar_proxy_ttft_seconds`: first generated token, as relayed by the proxy (streams only).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from starlette.requests import Request
from starlette.responses import Response

CONTENT_TYPE = CONTENT_TYPE_LATEST
ADDED_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25)
UPSTREAM_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
QUEUE_KEYS = ("queued", "pending")
"""The writer's queue depth, under its current name and its former one."""
SPILL_KEYS = {"spilled_rows": "rows", "spill_bytes": "bytes"}

StatsSource = Callable[[], Mapping[str, Any]]


class _Histogram:
    """Bucket counts (non-cumulative) and the sum; cumulated only when scraped."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # `le` is inclusive
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(
            (*map(floatToGoString, self.bounds), "+Inf"), self.counts, strict=True
        ):
            running += count
            out.append((bound, running))
        return out


class ProxyMetrics:
    """The proxy's counters and histograms, and the sink gauges (see the module docstring)."""

    def __init__(self, sink_stats: StatsSource | None = None) -> None:
        self._calls: dict[tuple[str, int], list[int]] = {}
        """(api_type, status) -> [calls, calls that did not complete]."""
        self._added = {False: _Histogram(ADDED_BUCKETS), True: _Histogram(ADDED_BUCKETS)}
        self._upstream = {False: _Histogram(UPSTREAM_BUCKETS), True: _Histogram(UPSTREAM_BUCKETS)}
        self._ttft = _Histogram(UPSTREAM_BUCKETS)
        self._tokens = [0, 0]
        """[prompt tokens, completion tokens] of logged calls."""
        self._sink_stats = sink_stats
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Collector(self))

    def observe(
        self, row: Mapping[str, Any], added_s: float | None, upstream_s: float | None = None
    ) -> None:
        """Account one logged call (`row` as built by `record.call_row`)."""
        status = row["status_code"]
        key = (row["api_type"], status)
        counts = self._calls.get(key)
        if counts is None:
            counts = self._calls[key] = [0, 0]
        counts[0] += 1
        if status >= 400 or not row["complete"]:
            counts[1] += 1
        stream = bool(row["stream"])
        if added_s is not None:
            self._added[stream].observe(added_s if added_s > 0.0 else 0.0)
        if upstream_s is None and stream:
            upstream_s = row["latency_ms"] / 1000.0
        if upstream_s is not None:
            self._upstream[stream].observe(upstream_s)
        ttft_ms = row.get("ttft_ms")
        if ttft_ms is not None:
            self._ttft.observe(ttft_ms / 1000.0)
        prompt, completion = row.get("prompt_ids"), row.get("completion_ids")
        if prompt:
            self._tokens[0] += len(prompt)
        if completion:
            self._tokens[1] += len(completion)

    def refused(self, api_type: str, response: Response) -> Response:
        """Count a call answered before it was forwarded (401, 400, 413, 503); pass it on."""
        key = (api_type, response.status_code)
        counts = self._calls.get(key)
        if counts is None:
            counts = self._calls[key] = [0, 0]
        counts[0] += 1
        counts[1] += 1
        return response

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        """The metric families, built from the plain numbers (see the module docstring)."""
        requests = CounterMetricFamily(
            "polar_proxy_requests",
            "LLM calls proxied, by API type and HTTP status returned to the agent",
            labels=["api_type", "status"],
        )
        errors = CounterMetricFamily(
            "polar_proxy_errors",
            "LLM calls that did not complete (upstream refused or unreachable, stream broken"
            " off, agent gone), by API type and HTTP status",
            labels=["api_type", "status"],
        )
        for (api_type, status), (calls, failed) in sorted(self._calls.items()):
            requests.add_metric([api_type, str(status)], calls)
            errors.add_metric([api_type, str(status)], failed)
        yield requests
        yield errors
        tokens = CounterMetricFamily(
            "polar_proxy_tokens",
            "Tokens of logged calls: prompt (in) and completion (out)",
            labels=["direction"],
        )
        tokens.add_metric(["in"], self._tokens[0])
        tokens.add_metric(["out"], self._tokens[1])
        yield tokens
        yield _histograms(
            "polar_proxy_added_latency_seconds",
            "Proxy time of a call excluding upstream time (streams: before the first byte)",
            self._added,
        )
        yield _histograms(
            "polar_proxy_upstream_seconds",
            "Upstream time of a call (streams: the whole stream)",
            self._upstream,
        )
        ttft = HistogramMetricFamily(
            "polar_proxy_ttft_seconds", "Time to the first generated token of a streamed call"
        )
        ttft.add_metric([], self._ttft.buckets(), self._ttft.total)
        yield ttft
        yield from _sink_gauges(self._sink_stats() if self._sink_stats is not None else {})


def _histograms(name: str, help_: str, by_stream: dict[bool, _Histogram]) -> Metric:
    family = HistogramMetricFamily(name, help_, labels=["stream"])
    for stream, histogram in by_stream.items():
        family.add_metric([str(stream).lower()], histogram.buckets(), histogram.total)
    return family


def _sink_gauges(raw: Mapping[str, Any]) -> Iterator[Metric]:
    """Gauges read from the call sink's `stats()` at scrape time."""
    stats = {k: v for k, v in raw.items() if _is_number(v)}
    queue = next((stats[k] for k in QUEUE_KEYS if k in stats), None)
    if queue is not None:
        yield GaugeMetricFamily(
            "polar_proxy_writer_queue_depth", "Call rows waiting for the writer", value=queue
        )
    spill = GaugeMetricFamily(
        "polar_proxy_spill_size", "Call rows spilled to the local buffer now", labels=["unit"]
    )
    for key, unit in SPILL_KEYS.items():
        if key in stats:
            spill.add_metric([unit], stats[key])
    yield spill
    if "refused" in stats:
        yield CounterMetricFamily(
            "polar_proxy_rows_refused",
            "Call rows the database refused (kept in the spill directory's refused/ file)",
            value=stats["refused"],
        )
    every = GaugeMetricFamily(
        "polar_proxy_call_sink", "Every counter the call sink reports", labels=["stat"]
    )
    for key, value in sorted(stats.items()):
        every.add_metric([key], value)
    yield every


async def metrics_endpoint(request: Request) -> Response:
    """`GET /metrics`: the app's registry (no token: see the module docstring)."""
    metrics: ProxyMetrics = request.app.state.proxy.metrics
    return Response(metrics.render(), 200, media_type=CONTENT_TYPE)


class _Collector(Collector):
    def __init__(self, metrics: ProxyMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.collect()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
