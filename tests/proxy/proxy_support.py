"""The in-process proxy harness: the fake vLLM injected as its transport, call rows in memory."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.config import Settings
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.testing.asgi_stream import StreamingASGITransport
from polar_mq.testing.fake_vllm import FakeStats, create_fake_vllm_app

SECRET = "proxy-test-secret"
UPSTREAM = "http://upstream.test"
FRESH_HTTP = httpx.Client(timeout=30.0, limits=httpx.Limits(max_keepalive_connections=0))
"""For polling and spreading loops: a new connection per request, as `httpx.get` opens (so that
calls spread over a proxy's workers), without a new client per request (an httpx client builds
its own SSL context unless given `polar_mq.infra.tls.client_ssl_context()`: ~20 ms of CPU each)."""


def proxy_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "secret_key": SECRET,
        "served_model": "fake-model",
        "upstream_url": UPSTREAM,
        "max_body_bytes": 64 * 1024,
    }
    values.update(overrides)
    return Settings(**values)


@dataclass
class Harness:
    """A running proxy (`client`), the fake behind it (`upstream`, `stats`) and the logged rows."""

    client: httpx.AsyncClient
    upstream: httpx.AsyncClient
    fake: Starlette
    sink: MemoryCallSink
    settings: Settings
    app: Starlette
    rollout_id: uuid.UUID = field(default_factory=uuid.uuid4)

    @property
    def stats(self) -> FakeStats:
        stats: FakeStats = self.fake.state.stats
        return stats

    @property
    def token(self) -> str:
        return issue_rollout_token(SECRET, self.rollout_id, 600)

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}

    async def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return await self.client.post(path, json=body, headers=self.auth)

    async def direct(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """What the fake answers to `body` when called without the proxy."""
        response = await self.upstream.post(path, json=body)
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        return data

    async def rows(self) -> list[dict[str, Any]]:
        await self.sink.flush()
        return self.sink.rows


async def start_harness(
    settings: Settings,
    fake: Starlette | None = None,
    use_transport: bool = True,
    streaming: bool = False,
) -> AsyncIterator[Harness]:
    """The proxy with `fake` injected as its upstream (or the real network: `use_transport=False`).

    `streaming` injects a transport that streams the fake's answer as it is produced (and tells the
    fake when the proxy hangs up) instead of `httpx.ASGITransport`, which buffers whole answers.
    """
    fake = fake or create_fake_vllm_app()
    sink = MemoryCallSink()
    transport: httpx.AsyncBaseTransport | None = None
    if use_transport:
        transport = StreamingASGITransport(fake) if streaming else httpx.ASGITransport(fake)
    app = create_proxy_app(settings, upstream_transport=transport, sink=sink)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://proxy") as client,
        httpx.AsyncClient(transport=httpx.ASGITransport(fake), base_url=UPSTREAM) as upstream,
    ):
        yield Harness(client, upstream, fake, sink, settings, app)
