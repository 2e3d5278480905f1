"""Serving the proxy with its HTTP/1.1 server (`http_server`) on uvloop when installed.

One process (`serve_one`), or with `proxy_workers > 1` a supervisor and that many children
(`supervisor`, started by `run.run_proxy`), each serving the shared socket and, for admin calls
fanned out to it by a sibling, a private Unix socket (`serve_worker`).
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
import socket
from collections.abc import Coroutine
from typing import Any

from polar_mq.config import Settings
from polar_mq.observability.logs import configure_from_settings
from polar_mq.proxy.server.app import create_proxy_app
from polar_mq.proxy.server.fanout import local_only
from polar_mq.proxy.server.http_server import LeanServer
from polar_mq.proxy.server.worker_slot import WorkerSlot

PARENT_CHECK_S = 1.0
"""How often a child checks that its supervisor still lives (an orphan stops serving)."""

GC_GEN0_THRESHOLD = 20_000
"""Allocations between young-generation collections (CPython's default: 700). A call allocates a
few thousand objects (the parsed bodies, the answer, the row), nearly all freed by reference
counting; at the default the collector ran several times per call."""


def tune_gc() -> None:
    """Collect less often, and never again walk what was imported and built at startup."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def serve_one(settings: Settings) -> None:
    """The proxy as one process on `settings.proxy_host:proxy_port` (`run.run_proxy`)."""
    app = create_proxy_app(settings)
    tune_gc()
    server = LeanServer(app, header_timeout_s=settings.header_read_timeout_s)
    _run_loop(server.serve(settings.proxy_host, settings.proxy_port))


def serve_worker(settings: Settings, slot: WorkerSlot, sock: socket.socket) -> None:
    """One child of `--workers N`: the app on the shared socket and on its control socket.

    The control socket serves the same app without its lifespan (the main server runs it) and
    without signal handlers: SIGTERM drains the main server, which then stops this one."""
    settings = slot.settings_for(settings)
    configure_from_settings(f"proxy-{slot.index}", settings)
    app = create_proxy_app(settings, worker=slot)
    timeout_s = settings.header_read_timeout_s
    main = LeanServer(app, header_timeout_s=timeout_s)
    control = LeanServer(local_only(app), header_timeout_s=timeout_s, lifespan=False)
    parent = os.getppid()
    tune_gc()

    async def serve() -> None:
        serving = asyncio.ensure_future(main.serve(sockets=[sock]))
        while not main.started and not serving.done():
            await asyncio.sleep(0.01)
        if serving.done():  # the app failed to start: the server already said why
            await serving
            return
        controlling = asyncio.ensure_future(
            control.serve(uds=str(slot.control_socket(slot.index)), handle_signals=False)
        )
        while not serving.done():
            await asyncio.wait({serving}, timeout=PARENT_CHECK_S)
            if os.getppid() != parent:  # the supervisor is gone: stop like on SIGTERM
                main.should_exit = True
        control.should_exit = True
        await controlling
        await serving

    _run_loop(serve())


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run `main` on uvloop when installed."""
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)
