"""Prometheus metrics: counters move with the calls served, the scrape parses, sink gauges read."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from proxy_support import Harness, proxy_settings, start_harness

from polar_mq.proxy.metrics import ProxyMetrics

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
QUESTION = [{"role": "user", "content": "What is 9 * 9?"}]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape by (name, labels); parsing fails on an invalid exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(scrape: dict[Any, float], name: str, **labels: str) -> float:
    return scrape.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(harness: Harness) -> dict[Any, float]:
    response = await harness.client.get("/metrics")  # no token: Prometheus has none
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    return samples(response.text)


@pytest.mark.anyio
async def test_counters_follow_the_calls_served(harness: Harness) -> None:
    before = await scrape(harness)
    assert value(before, "polar_proxy_requests_total", api_type="chat", status="200") == 0
    chat = {"model": "my-policy", "messages": QUESTION}
    assert (await harness.post(CHAT, chat)).status_code == 200
    assert (await harness.post(CHAT, {**chat, "stream": True})).status_code == 200
    assert (await harness.post(COMPLETIONS, {"model": "m", "prompt": "x"})).status_code == 200
    assert (await harness.post(CHAT, {"model": "my-policy", "messages": []})).status_code == 400
    assert (await harness.client.post(CHAT, json=chat)).status_code == 401  # not logged
    huge = {"model": "m", "prompt": "x" * harness.settings.max_body_bytes}
    assert (await harness.post(COMPLETIONS, huge)).status_code == 413  # not logged either
    rows = await harness.rows()
    after = await scrape(harness)

    requests = "polar_proxy_requests_total"
    assert value(after, requests, api_type="chat", status="200") == 2
    assert value(after, requests, api_type="completions", status="200") == 1
    assert value(after, requests, api_type="chat", status="400") == 1
    assert value(after, "polar_proxy_errors_total", api_type="chat", status="400") == 1
    assert value(after, "polar_proxy_errors_total", api_type="chat", status="200") == 0
    for api_type, status in (("chat", "401"), ("completions", "413")):  # refused, not forwarded
        assert value(after, requests, api_type=api_type, status=status) == 1
        assert value(after, "polar_proxy_errors_total", api_type=api_type, status=status) == 1
    tokens_in = sum(len(r["prompt_ids"] or ()) for r in rows)
    tokens_out = sum(len(r["completion_ids"] or ()) for r in rows)
    assert tokens_in > 0 and tokens_out > 0
    assert value(after, "polar_proxy_tokens_total", direction="in") == tokens_in
    assert value(after, "polar_proxy_tokens_total", direction="out") == tokens_out
    added = "polar_proxy_added_latency_seconds_count"
    assert value(after, added, stream="false") == 2  # the 200s (an error has no upstream split)
    assert value(after, added, stream="true") == 1
    assert value(after, "polar_proxy_upstream_seconds_count", stream="false") == 2
    assert value(after, "polar_proxy_ttft_seconds_count") == 1
    assert value(after, "polar_proxy_call_sink", stat="written") == len(rows) == 4
    assert value(after, "polar_proxy_writer_queue_depth") == 0


@pytest.mark.anyio
async def test_each_app_has_its_own_registry() -> None:
    async for first in start_harness(proxy_settings()):
        async for second in start_harness(proxy_settings()):
            await first.post(CHAT, {"model": "my-policy", "messages": QUESTION})
            one, other = await scrape(first), await scrape(second)
            name = "polar_proxy_requests_total"
            assert value(one, name, api_type="chat", status="200") == 1
            assert value(other, name, api_type="chat", status="200") == 0


def test_sink_gauges_are_read_at_scrape_time_and_defensively() -> None:
    stats: dict[str, Any] = {
        "queued": 3, "spilled_rows": 5, "spill_bytes": 4096, "refused": 2, "note": "x"
    }  # fmt: skip
    metrics = ProxyMetrics(lambda: stats)
    first = samples(metrics.render().decode())
    assert value(first, "polar_proxy_writer_queue_depth") == 3
    assert value(first, "polar_proxy_spill_size", unit="rows") == 5
    assert value(first, "polar_proxy_spill_size", unit="bytes") == 4096
    assert value(first, "polar_proxy_call_sink", stat="queued") == 3
    assert value(first, "polar_proxy_rows_refused_total") == 2
    assert ("polar_proxy_call_sink", (("stat", "note"),)) not in first  # not a number
    stats.clear()
    stats["pending"] = 7  # an older writer's name for the queue depth; no spill keys at all
    second = samples(metrics.render().decode())
    assert value(second, "polar_proxy_writer_queue_depth") == 7
    assert ("polar_proxy_spill_size", (("unit", "rows"),)) not in second
    assert ("polar_proxy_rows_refused_total", ()) not in second


def test_histograms_are_cumulative_with_inclusive_bounds() -> None:
    metrics = ProxyMetrics()
    row = {"api_type": "chat", "status_code": 200, "complete": True, "stream": False}
    for added in (0.001, 0.0011, 7.0, -1e-6):  # a negative (clock) difference counts as 0
        metrics.observe({**row, "latency_ms": 1.0}, added, 0.02)
    scrape = samples(metrics.render().decode())
    bucket = "polar_proxy_added_latency_seconds_bucket"
    assert value(scrape, bucket, le="5e-05", stream="false") == 1
    assert value(scrape, bucket, le="0.001", stream="false") == 2
    assert value(scrape, bucket, le="0.0025", stream="false") == 3
    assert value(scrape, bucket, le="+Inf", stream="false") == 4
    assert value(scrape, "polar_proxy_added_latency_seconds_sum", stream="false") == pytest.approx(
        7.0021
    )
    assert value(scrape, "polar_proxy_upstream_seconds_count", stream="false") == 4
