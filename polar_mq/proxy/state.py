"""The proxy's per-process resources, created in the app lifespan and kept on `app.state.proxy`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from polar_mq.proxy.auth import RolloutAuth
from polar_mq.proxy.record import SeqCounter
from polar_mq.proxy.writer import CallSink


@dataclass(slots=True)
class ProxyState:
    client: httpx.AsyncClient
    """One pooled client for every upstream call (never one per request)."""
    transport: httpx.AsyncBaseTransport
    """The client's transport (its connection pool), which the hot path calls directly."""
    timeouts: dict[str, Any]
    """Request extensions carrying the upstream timeouts."""
    urls: dict[str, httpx.URL]
    """Upstream URL per API path, parsed once (URL parsing is costly in httpx)."""
    sink: CallSink
    auth: RolloutAuth
    seqs: SeqCounter
    backend: str
    served_model: str | None
    max_body_bytes: int
    admin_token: str | None
