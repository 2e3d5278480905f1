"""The worker's half of `network: proxy_only`: one Unix socket per command, relayed to the proxy.

Why a socket served by the worker and not by the proxy itself: the proxy may run on another node,
and the worker already supervises the command, so the relay lives exactly as long as the command
(it is opened before the sandbox starts and closed when `exec` returns) and needs no process of
its own. It connects to the one address recorded by `agent_proxy_url` and to nothing else, so a
sandbox whose only way out is this socket reaches the proxy and nothing else.

The socket is created in a fresh private directory (short path: Unix socket paths are limited to
108 bytes) and owned by the agent user with mode 0600, so only the sandbox's user may connect.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from types import TracebackType

from polar_mq.runtimes.forwarder import relay_pair
from polar_mq.runtimes.identity import AgentIdentity

_ACCEPT_POLL_S = 0.5


class ProxyRelay:
    """A context manager serving `socket_path` while a command runs."""

    def __init__(self, target: tuple[str, int], agent: AgentIdentity) -> None:
        self.target = target
        self.agent = agent
        self._dir = Path(tempfile.mkdtemp(prefix="pmq-relay-"))
        self.socket_path = self._dir / "proxy.sock"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="proxy-relay", daemon=True)

    def __enter__(self) -> ProxyRelay:
        try:
            self._listener.bind(str(self.socket_path))
            self.socket_path.chmod(0o600)
            if self.agent.switch:
                self._dir.chmod(0o711)
                os.chown(self.socket_path, self.agent.uid, self.agent.gid)
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

    def _cleanup(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)

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
