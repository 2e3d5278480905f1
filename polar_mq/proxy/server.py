"""Serving the proxy: uvicorn with uvloop/httptools when installed and no access log (hot path)."""

from __future__ import annotations

import importlib.util

from polar_mq.config import Settings
from polar_mq.observability.logs import configure_from_settings
from polar_mq.proxy.app import create_proxy_app


def uvicorn_options() -> dict[str, str]:
    """The fastest event loop and HTTP parser available here."""
    has = importlib.util.find_spec
    return {
        "loop": "uvloop" if has("uvloop") else "asyncio",
        "http": "httptools" if has("httptools") else "h11",
    }


def run_proxy(settings: Settings) -> None:
    """Serve the proxy on `settings.proxy_host:proxy_port` until interrupted."""
    import uvicorn

    configure_from_settings("proxy", settings)
    uvicorn.run(
        create_proxy_app(settings),
        host=settings.proxy_host,
        port=settings.proxy_port,
        access_log=False,
        log_config=None,  # uvicorn's lines go through our handlers (JSON, the log directory)
        log_level="warning",
        lifespan="on",
        **uvicorn_options(),  # type: ignore[arg-type]
    )
