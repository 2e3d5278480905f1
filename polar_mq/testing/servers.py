"""Serve an ASGI app on a real socket from a background thread (tests, benchmarks).

In-process transports skip what only a socket shows (HTTP framing, real streaming, disconnects);
a server in a thread keeps the app's objects (stats, sinks) inspectable from the test. `server`
picks uvicorn or the proxy's own lean server (`polar_mq.proxy.server.http_server`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import uvicorn
from starlette.types import ASGIApp

from polar_mq.infra.ports import free_port


@contextmanager
def serve_in_thread(
    app: ASGIApp,
    port: int | None = None,
    timeout_s: float = 10.0,
    server: Literal["uvicorn", "lean"] = "uvicorn",
) -> Iterator[str]:
    """Run `app` (lifespan included) on 127.0.0.1; yields its base URL; stops it on exit."""
    port = port or free_port()
    if server == "lean":
        with _serve_lean(app, port, timeout_s):
            yield f"http://127.0.0.1:{port}"
        return
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on"
    )
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    _wait_started(lambda: uv.started, thread, port, timeout_s)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        uv.should_exit = True
        thread.join(timeout_s)


@contextmanager
def _serve_lean(app: ASGIApp, port: int, timeout_s: float) -> Iterator[None]:
    from polar_mq.proxy.server.http_server import LeanServer

    lean = LeanServer(app)
    loops: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        loops.append(asyncio.get_running_loop())
        await lean.serve("127.0.0.1", port, handle_signals=False)

    thread = threading.Thread(target=asyncio.run, args=(main(),), name=f"lean-{port}", daemon=True)
    thread.start()
    _wait_started(lambda: lean.started, thread, port, timeout_s)
    try:
        yield
    finally:
        loops[0].call_soon_threadsafe(setattr, lean, "should_exit", True)
        thread.join(timeout_s)


def _wait_started(
    started: Callable[[], bool], thread: threading.Thread, port: int, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while not started():
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"server on port {port} did not start")
        time.sleep(0.01)
