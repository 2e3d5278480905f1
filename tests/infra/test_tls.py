"""polar_mq's HTTP clients share one verifying TLS context per process (`polar_mq.infra.tls`)."""

from __future__ import annotations

import ssl

import httpx

from polar_mq.client import AsyncClient, Client
from polar_mq.infra.tls import client_ssl_context


def _context_of(http: httpx.Client | httpx.AsyncClient) -> ssl.SSLContext:
    return http._transport._pool._ssl_context  # type: ignore[union-attr]


def test_sdk_clients_share_the_process_context_and_it_verifies() -> None:
    first, second = Client("http://127.0.0.1:9"), Client("https://example.invalid")
    third = AsyncClient("http://127.0.0.1:9")
    shared = client_ssl_context()
    assert _context_of(first._http) is shared
    assert _context_of(second._http) is shared
    assert _context_of(third._http) is shared
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname
    assert _context_of(httpx.Client()) is not shared  # what httpx alone does: one per client
    first.close()
    second.close()
