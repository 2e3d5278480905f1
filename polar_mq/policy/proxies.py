"""Driving every proxy through a weight update: pause and drain, stamp the version, resume.

The proxies' own admin endpoints do the work (`polar_mq.proxy.backends.admin`); this calls them
on all proxies at once, so a fleet drains in the time of its slowest proxy, not their sum. A proxy
that cannot be reached is reported, not fatal: it converges from the database on its own within
`policy_sync_s` (see `polar_mq.proxy.policy_sync`), and the answer tells the trainer which proxy
did not confirm, so it can decide whether to load weights anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from polar_mq.infra.tls import client_ssl_context
from polar_mq.policy.weights import Adapter

CONNECT_TIMEOUT_S = 5.0
LOAD_TIMEOUT_S = 300.0
"""An adapter load: the proxies load into their backends at once, each within this."""


@dataclass(frozen=True, slots=True)
class ProxyReport:
    url: str
    ok: bool
    in_flight: int | None = None
    """Calls still running on that proxy's backends after the drain wait (pause only)."""
    in_flight_at_pause: int | None = None
    """Calls that were running when the pause began: the ones the drain waited for."""
    drained: bool | None = None
    error: str | None = None
    adapter_loads: dict[str, str | None] | None = None
    """Adapter load: each backend's error, None where it loaded (a backend that failed is out of
    that proxy's rotation)."""
    unloaded: list[str] | None = None
    """Adapter load with `unload_others`: the `backend:adapter` pairs unloaded."""


class ProxyControl:
    def __init__(self, urls: Sequence[str], admin_token: str | None) -> None:
        self.urls = list(urls)
        self.headers = {"authorization": f"Bearer {admin_token}"} if admin_token else {}

    def pause(self, version: int, drain_timeout_s: float) -> list[ProxyReport]:
        """Hold new calls, stamp `version` for what is served after the resume, and wait up to
        `drain_timeout_s` for the calls in flight (they finish on the old weights)."""

        def one(client: httpx.Client, url: str) -> ProxyReport:
            # Paused before the version moves: a call that starts in between would be stamped
            # with the new version and served by the old weights.
            first = self._post(client, url, "/admin/pause", {})
            self._post(client, url, "/admin/policy_version", {"version": version})
            answer = self._post(
                client,
                url,
                "/admin/pause",
                {},
                params={"wait_drained": "true", "timeout_s": str(drain_timeout_s)},
            )
            return ProxyReport(
                url,
                True,
                in_flight=int(answer["in_flight"]),
                drained=bool(answer["drained"]),
                in_flight_at_pause=int(first["in_flight"]),
            )

        return self._each(one, read_timeout_s=drain_timeout_s + 10)

    def load_adapter(self, adapter: Adapter, unload_others: bool) -> list[ProxyReport]:
        """Load `adapter` into every backend of every proxy (paused and drained first); with
        `unload_others`, unload the adapters loaded before (no call can still use them)."""
        body = {"name": adapter.name, "path": adapter.path, "unload_others": unload_others}

        def one(client: httpx.Client, url: str) -> ProxyReport:
            answer = self._post(client, url, "/admin/adapter", body)
            loads = {str(k): (None if v is None else str(v)) for k, v in answer["backends"].items()}
            unloaded = [str(u) for u in answer["unloaded"]]
            return ProxyReport(url, True, adapter_loads=loads, unloaded=unloaded)

        return self._each(one, read_timeout_s=LOAD_TIMEOUT_S + 30)

    def resume(self, version: int) -> list[ProxyReport]:
        def one(client: httpx.Client, url: str) -> ProxyReport:
            self._post(client, url, "/admin/policy_version", {"version": version})
            self._post(client, url, "/admin/resume", {})
            return ProxyReport(url, True)

        return self._each(one)

    def set_version(self, version: int) -> list[ProxyReport]:
        def one(client: httpx.Client, url: str) -> ProxyReport:
            self._post(client, url, "/admin/policy_version", {"version": version})
            return ProxyReport(url, True)

        return self._each(one)

    def _post(
        self,
        client: httpx.Client,
        url: str,
        path: str,
        body: dict[str, Any],
        params: dict[str, str] | None = None,
    ) -> Any:
        response = client.post(url + path, json=body, params=params, headers=self.headers)
        if response.status_code != 200:
            raise RuntimeError(f"{path}: HTTP {response.status_code} {response.text[:200]}")
        return response.json()

    def _each(
        self,
        call: Callable[[httpx.Client, str], ProxyReport],
        read_timeout_s: float = 30.0,
    ) -> list[ProxyReport]:
        if not self.urls:
            return []
        timeout = httpx.Timeout(read_timeout_s, connect=CONNECT_TIMEOUT_S)

        def guarded(url: str) -> ProxyReport:
            try:
                with httpx.Client(
                    timeout=timeout, trust_env=False, verify=client_ssl_context()
                ) as client:
                    return call(client, url)
            except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as exc:
                return ProxyReport(url, False, error=f"{type(exc).__name__}: {exc}")

        with ThreadPoolExecutor(max_workers=min(16, len(self.urls))) as executor:
            return list(executor.map(guarded, self.urls))
