"""The health-check loop: every few seconds ask each backend whether it is up.

`GET /health` (vLLM, SGLang), falling back to `GET /v1/models` for OpenAI-compatible servers
without it. A pass closes the backend's breaker (a backend that came back is used again even if no
call probes it); a failure counts like a failed call, so a dead backend is taken out within
`breaker_failures` checks even when no traffic reaches it.

With a LoRA adapter published, a backend that comes back from failed checks (a restarted engine
has lost its adapters) leaves the rotation until it has loaded the adapter again, and after each
round the adapter is loaded into every healthy backend that lacks it (`polar_mq.proxy.adapters`).
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from polar_mq.proxy.adapters import reconcile
from polar_mq.proxy.backends.backend import Backend
from polar_mq.proxy.backends.pool import BackendPool

logger = logging.getLogger(__name__)


async def check_backend(backend: Backend, timeout_s: float) -> bool:
    """One health check of `backend`; updates its breaker and `last_health`."""
    try:
        response = await backend.client.get("/health", timeout=timeout_s)
        if response.status_code == 404:
            response = await backend.client.get("/v1/models", timeout=timeout_s)
    except httpx.HTTPError as exc:
        verdict = f"error: {type(exc).__name__}"
    else:
        verdict = "ok" if response.status_code == 200 else f"status {response.status_code}"
    if backend.removed:
        return False
    healthy = verdict == "ok"
    recovered = backend.last_health not in (None, "ok")
    if healthy and recovered and backend.adapter is not None and backend.adapter_error is None:
        backend.adapter_error = "back from a failed health check: reloading the adapter"
    if healthy:
        backend.breaker.record_success()
    else:
        if backend.last_health == "ok" or backend.last_health is None:
            logger.warning("backend %s failed its health check (%s)", backend.name, verdict)
        backend.breaker.record_failure()
    backend.last_health = verdict
    return healthy


class HealthChecker:
    """Runs `check_backend` on every backend of `pool` each `interval_s`, as one background task."""

    def __init__(self, pool: BackendPool, interval_s: float, timeout_s: float) -> None:
        self.pool = pool
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            backends = list(self.pool.backends.values())
            await asyncio.gather(*(check_backend(b, self.timeout_s) for b in backends))
            await reconcile(self.pool)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
