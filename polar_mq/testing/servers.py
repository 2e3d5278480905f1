"""Serve an ASGI app on a real socket from a background thread (tests, benchmarks).

In-process transports skip what only a socket shows (HTTP framing, real streaming, disconnects);
a uvicorn server in a thread keeps the app's objects (stats, sinks) inspectable from the test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.types import ASGIApp

from polar_mq.processes import free_port


@contextmanager
def serve_in_thread(
    app: ASGIApp, port: int | None = None, timeout_s: float = 10.0
) -> Iterator[str]:
    """Run `app` (lifespan included) on 127.0.0.1; yields its base URL; stops it on exit."""
    port = port or free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"server on port {port} did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
