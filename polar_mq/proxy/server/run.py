"""`run_proxy`: the proxy as one process, or as a supervisor of `proxy_workers` children.

Lean on purpose: a supervisor imports neither the app nor its servers, which its fork server
imports once for the children (`supervisor`); importing them here as well cost every
`--workers N` start about 1.1 CPU-s (1.4 instead of 0.3 CPU-s of imports) and the supervisor a
copy of the app's modules in memory.
"""

from __future__ import annotations

from polar_mq.config import Settings
from polar_mq.observability.logs import configure_from_settings


def run_proxy(settings: Settings) -> None:
    """Serve the proxy on `settings.proxy_host:proxy_port` until interrupted."""
    configure_from_settings("proxy", settings)
    if settings.proxy_workers > 1:
        from polar_mq.proxy.server.supervisor import run_workers

        run_workers(settings, settings.proxy_workers)
        return
    from polar_mq.proxy.server.serve import serve_one

    serve_one(settings)
