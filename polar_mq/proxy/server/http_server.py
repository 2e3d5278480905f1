"""The proxy's HTTP server: listen, run the app's lifespan, serve connections, drain on SIGTERM.

The only server of `polar-mq proxy`, on its port and, under `--workers N`, on each child's
control socket. Routing, auth, body limits and deadlines, streaming and logging are the ASGI
app's; only the HTTP layer is here (`http_conn`), which does less per request than a general
server (docs/benchmarks.md), and `tests/proxy/test_http_conformance.py` holds it to what a
general server guarantees. A connection that asks to upgrade is handed to uvicorn's protocol.
SIGTERM or SIGINT stops accepting, closes idle connections, lets every request in hand finish
(streams included), then runs the lifespan's shutdown (the call writer drains) and returns.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from typing import Any

from starlette.types import ASGIApp, Message

from polar_mq.infra.header_timeout import HeadDeadline, HeadDeadlineHooks, close_late
from polar_mq.proxy.server.http_conn import Connection

logger = logging.getLogger(__name__)

KEEPALIVE_S = 5.0
"""An idle keep-alive connection is closed after this long (uvicorn's default)."""
BACKLOG = 2048
DRAIN_POLL_S = 0.02


class LifespanFailed(RuntimeError):
    """The app's lifespan startup failed (the message says why)."""


class Lifespan:
    """Runs the app's ASGI lifespan protocol: startup before serving, shutdown after."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self._started: asyncio.Future[str] = loop.create_future()
        self._stopped: asyncio.Future[str] = loop.create_future()
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        self._task = asyncio.ensure_future(self._run())
        await self._inbox.put({"type": "lifespan.startup"})
        failure = await self._started
        if failure:
            raise LifespanFailed(failure)

    async def shutdown(self) -> None:
        await self._inbox.put({"type": "lifespan.shutdown"})
        failure = await self._stopped
        if failure:
            logger.error("the proxy's shutdown failed: %s", failure)
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        try:
            await self.app(scope, self._inbox.get, self._send)
        except BaseException as exc:
            logger.exception("the proxy's lifespan failed")
            for future in (self._started, self._stopped):
                if not future.done():
                    future.set_result(repr(exc) or "lifespan failed")
            if not isinstance(exc, Exception):
                raise

    async def _send(self, message: Message) -> None:
        kind = message["type"]
        future = self._started if kind.startswith("lifespan.startup") else self._stopped
        if not future.done():
            future.set_result(message.get("message") or kind if kind.endswith(".failed") else "")


class DeadlineConnection(HeadDeadlineHooks, Connection):
    """A connection whose request heads must arrive within `header_timeout_s` (see
    `polar_mq.infra.header_timeout`: armed on connect and on a head's first byte)."""

    def __init__(self, *args: Any, header_timeout_s: float) -> None:
        super().__init__(*args)
        self.header_timeout_s = header_timeout_s
        self.head_deadline = HeadDeadline(self.loop, header_timeout_s, self._head_late)

    def _head_late(self) -> None:
        if self.reading_paused:  # the server stopped reading (requests queued), not the client
            self.head_deadline.arm()
            return
        if self.current is not None:  # a pipelined head is late: finish the one in hand, close
            self.pause_reading()
            self.shutdown()
            return
        close_late(self.transport, self.head_started, self.header_timeout_s)


class LeanServer:
    """Serves `app` on a host and port, on given sockets or on a Unix socket until
    `should_exit` is set.

    `header_timeout_s`: a connection's request head must arrive within it (None: no deadline).
    `lifespan=False`: the app's lifespan is run by another server of the same app (a worker's
    control socket beside its main server)."""

    def __init__(
        self,
        app: ASGIApp,
        keepalive_s: float = KEEPALIVE_S,
        header_timeout_s: float | None = None,
        lifespan: bool = True,
    ) -> None:
        self.app = app
        self.lifespan = lifespan
        self.keepalive_s = keepalive_s
        self.header_timeout_s = header_timeout_s
        self.connections: set[Connection] = set()
        self.started = False
        self._exit: asyncio.Event | None = None
        self._should_exit = False

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value and self._exit is not None:
            self._exit.set()

    def _connection(self) -> Connection:
        offset = time.time() - asyncio.get_running_loop().time()
        args = (self.app, self.connections, self.keepalive_s, offset, handoff)
        if self.header_timeout_s is None:
            return Connection(*args)
        return DeadlineConnection(*args, header_timeout_s=self.header_timeout_s)

    async def serve(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        sockets: list[socket.socket] | None = None,
        handle_signals: bool = True,
        uds: str | None = None,
    ) -> None:
        """Start the lifespan, listen, serve until told to stop, then drain (see the module).

        `sockets` when given, else the Unix socket `uds` when given, else `host:port`."""
        loop = asyncio.get_running_loop()
        self._exit = asyncio.Event()
        if self._should_exit:
            self._exit.set()
        lifespan = Lifespan(self.app) if self.lifespan else None
        if lifespan is not None:
            try:
                await lifespan.startup()
            except LifespanFailed as exc:
                logger.error("the proxy could not start: %s", exc)
                raise SystemExit(3) from None
        if sockets:
            servers = [
                await loop.create_server(self._connection, sock=sock, backlog=BACKLOG)
                for sock in sockets
            ]
        elif uds is not None:  # a stale socket file (a restarted worker's) is replaced
            servers = [await loop.create_unix_server(self._connection, uds, backlog=BACKLOG)]
        else:
            servers = [
                await loop.create_server(
                    self._connection, host, port, backlog=BACKLOG, reuse_address=True
                )
            ]
        handled: list[signal.Signals] = []
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
                handled.append(sig)
        self.started = True
        try:
            await self._exit.wait()
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)
            await self._drain(servers)
            if lifespan is not None:
                await lifespan.shutdown()

    def _on_signal(self, sig: signal.Signals) -> None:
        logger.info("proxy: signal %s, draining", sig.name)
        self.should_exit = True

    async def _drain(self, servers: list[asyncio.Server]) -> None:
        for server in servers:
            server.close()
        while self.connections:
            for conn in list(self.connections):
                conn.shutdown()
            await asyncio.sleep(DRAIN_POLL_S)
        for server in servers:
            await server.wait_closed()


def handoff(conn: Connection, first_input: bytes) -> bool:
    """Give `conn`'s transport to uvicorn's httptools protocol (upgrade requests), replaying
    its first input; False when uvicorn's protocol is not available."""
    try:
        import uvicorn
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        from uvicorn.server import ServerState
    except ImportError:  # pragma: no cover - uvicorn is a dependency
        return False
    config = _uvicorn_config(conn.app, uvicorn)
    protocol = HttpToolsProtocol(config=config, server_state=ServerState(), app_state={})
    transport = conn.transport
    protocol.connection_made(transport)
    transport.set_protocol(protocol)
    protocol.data_received(first_input)
    return True


_configs: dict[int, Any] = {}


def _uvicorn_config(app: ASGIApp, uvicorn: Any) -> Any:
    config = _configs.get(id(app))
    if config is None:
        config = uvicorn.Config(
            app, lifespan="off", log_config=None, access_log=False, http="httptools"
        )
        config.load()
        _configs[id(app)] = config
    return config
