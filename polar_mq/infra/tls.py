"""One TLS context per process for every HTTP client polar_mq builds.

httpx builds a fresh `ssl.SSLContext` for every client it creates, loading the whole CA bundle,
whether or not the client ever speaks TLS. polar_mq creates clients often (one per SDK `Client`,
per readiness wait, per proxy backend, per admin fan-out), and in the test suite the contexts
alone were a large share of the pytest processes' CPU (figures: docs/benchmarks.md). An
`SSLContext` is safe to share between clients and threads, so each process builds the default one
(httpx's rules: `SSL_CERT_FILE`, `SSL_CERT_DIR`, else certifi's
bundle) once, on first use, and hands it to every client as `verify=`.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def client_ssl_context() -> ssl.SSLContext:
    """The process's verifying client context, built on first use."""
    return httpx.create_ssl_context()
