"""The worker's half of `network: proxy_only`: one Unix socket per command, relayed to the proxy.

Why a socket served by the worker and not by the proxy itself: the proxy may run on another node,
and the worker already supervises the command, so the relay lives exactly as long as the command
(it is opened before the sandbox starts and closed when `exec` returns) and needs no process of
its own. It connects to the one address recorded by `agent_proxy_url` and to nothing else, so a
sandbox whose only way out is this socket reaches the proxy and nothing else.

The socket is owned by the agent user with mode 0600, so only the sandbox's user may connect. It is
created in a fresh private directory (bwrap binds the socket file itself into the sandbox), or,
for a sandbox that mounts one directory for its lifetime (a docker container), in that directory
under a name of its own per command (so two commands never share one). Unix socket paths are
limited to 108 bytes: the socket is bound through the directory's descriptor, so a long runtime
path does not matter.

`record_route` and `recorded_route` keep the proxy's address next to the runtime: the run-agent
stage learns it (`Runtime.agent_proxy_url`) and later handles, in other processes, relay to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import threading
import uuid
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

from polar_mq.runtimes.forwarder import relay_pair
from polar_mq.runtimes.identity import AgentIdentity
from polar_mq.runtimes.process_kit import atomic_write

_ACCEPT_POLL_S = 0.5
PROXY_PORT_INSIDE = 8010
"""Where `proxy_only` sandboxes find the proxy (their loopback is their own: any port is free)."""
ROUTE_FILE = "proxy_route.json"


def record_route(runtime_dir: Path, url: str) -> str:
    """Record the proxy's host and port for the relay; return the URL the agent uses inside."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"network proxy_only relays plain http proxies only, not {url!r}")
    route = {"host": parts.hostname, "port": parts.port or 80}
    atomic_write(runtime_dir / ROUTE_FILE, json.dumps(route).encode())
    inside = f"127.0.0.1:{PROXY_PORT_INSIDE}"
    return urlunsplit(("http", inside, parts.path, parts.query, parts.fragment))


def recorded_route(runtime_dir: Path) -> tuple[str, int] | None:
    """The address `record_route` kept, or None before the agent's proxy URL was asked for."""
    try:
        route = json.loads((runtime_dir / ROUTE_FILE).read_text())
        return str(route["host"]), int(route["port"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ProxyRelay:
    """A context manager serving `socket_path` while a command runs.

    `directory`: an existing directory the sandbox sees (the socket is named `socket_name` in
    it and only the socket is removed at the end); None makes a private one, removed whole.
    """

    def __init__(
        self, target: tuple[str, int], agent: AgentIdentity, directory: Path | None = None
    ) -> None:
        self.target = target
        self.agent = agent
        self._owns_dir = directory is None
        self._dir = Path(tempfile.mkdtemp(prefix="pmq-relay-")) if directory is None else directory
        self.socket_name = "proxy.sock" if directory is None else f"{uuid.uuid4().hex}.sock"
        self.socket_path = self._dir / self.socket_name
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="proxy-relay", daemon=True)

    def __enter__(self) -> ProxyRelay:
        try:
            self._bind()
            self._listener.listen(128)
            self._listener.settimeout(_ACCEPT_POLL_S)
        except BaseException:
            self._cleanup()
            raise
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # not joined: a blocked accept on a Unix socket wakes only at its next poll, and waiting
        # for it would add up to that much to every command; the thread ends by itself then
        self._closed.set()
        self._cleanup()

    def _bind(self) -> None:
        """Bind through the directory's descriptor (no path limit), then hand it to the agent."""
        fd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._listener.bind(f"/proc/self/fd/{fd}/{self.socket_name}")
            os.chmod(self.socket_name, 0o600, dir_fd=fd)
            if self.agent.switch:
                os.chmod(fd, 0o711)
                os.chown(self.socket_name, self.agent.uid, self.agent.gid, dir_fd=fd)
        finally:
            os.close(fd)

    def _cleanup(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        if self._owns_dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                self.socket_path.unlink()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()  # the agent sees a closed connection, as with a proxy that is down
            return
        upstream.settimeout(None)
        relay_pair(client, upstream)
