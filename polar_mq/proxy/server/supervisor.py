"""`polar-mq proxy --workers N`: N proxy processes serving one port, under one supervisor.

One Python process saturates one core, so a proxy with more calls than that needs processes. The
parent binds the listening socket once and starts N children, forked from a fork server that has
imported the proxy once (none inherits the parent's state, and a start or a restart after a crash
takes a fraction of a second of CPU); the kernel hands each new connection to whichever child
accepts it. The parent only supervises: a child that dies is started again in the same slot
(same spill subdirectory, so its spilled rows are replayed exactly once; the directories of a
previous layout are taken over by the new children, `spill_layout`), and SIGTERM or SIGINT is
passed to every child, each of which drains like a single proxy (stops accepting, finishes its
calls, flushes its writer), before the parent exits.

Each child keeps its own call writer and spill directory (`<spill>/worker-<i>`: two processes
never share a segment file) and listens on a private Unix socket in a run directory the parent
creates; admin calls fan out over those sockets (`fanout`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

from polar_mq.config import Settings
from polar_mq.infra.forking import preload, start_forked
from polar_mq.proxy.server.worker_slot import WorkerSlot

logger = logging.getLogger(__name__)

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
"""Wait before restarting a slot that died again soon after its last start."""
STABLE_AFTER_S = 30.0
"""A child that lived this long restarts at once (its backoff resets)."""
PROXY_WORKER_IMPORTS = ("polar_mq.proxy.server.serve",)
"""What the fork server imports once for the proxy's children (`polar_mq.infra.forking`)."""
STOP_TIMEOUT_S = 900.0
"""After SIGTERM, how long the parent waits for its children to drain before killing them."""


def bind_socket(host: str, port: int) -> socket.socket:
    """The shared listening socket (IPv6 when `host` is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(4096)
    sock.set_inheritable(True)
    return sock


def _child(settings: Settings, slot: WorkerSlot, sock: socket.socket) -> None:
    from polar_mq.proxy.server.serve import serve_worker

    serve_worker(settings, slot, sock)


class Supervisor:
    """Starts the children, restarts the dead ones, stops them all on a signal."""

    def __init__(self, settings: Settings, count: int) -> None:
        self.settings = settings
        self.count = count
        self.sock = bind_socket(settings.proxy_host, settings.proxy_port)
        self.run_dir = Path(tempfile.mkdtemp(prefix="polar-mq-proxy-"))
        self.children: dict[int, BaseProcess] = {}
        self.started: dict[int, float] = {}
        self.failures: dict[int, int] = {}
        self.stopping = False
        preload(PROXY_WORKER_IMPORTS)

    def start(self, index: int) -> None:
        slot = WorkerSlot(index, self.count, self.run_dir)
        proc = start_forked(_child, (self.settings, slot, self.sock), f"polar-mq-proxy-{index}")
        self.children[index] = proc
        self.started[index] = time.monotonic()

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if self.stopping and sig == signal.SIGINT:  # a second Ctrl-C: stop at once
            for proc in self.children.values():
                if proc.pid is not None and proc.is_alive():
                    os.kill(proc.pid, signal.SIGKILL)
        self.stopping = True
        for proc in self.children.values():
            if proc.pid is not None and proc.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)

    def restart_dead(self) -> None:
        for index, proc in list(self.children.items()):
            if proc.is_alive() or self.stopping:
                continue
            lived = time.monotonic() - self.started[index]
            failures = 0 if lived >= STABLE_AFTER_S else self.failures.get(index, 0) + 1
            self.failures[index] = failures
            logger.warning(
                "proxy worker %d exited (code %s) after %.1f s; restarting",
                index,
                proc.exitcode,
                lived,
            )
            if failures:
                time.sleep(RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S)) - 1])
            if not self.stopping:
                self.start(index)

    def run(self) -> int:
        """Serve until a signal; the exit code is 0 when every child stopped cleanly."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            for index in range(self.count):
                self.start(index)
            while not self.stopping:
                time.sleep(0.2)
                self.restart_dead()
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for proc in self.children.values():
                proc.join(max(0.0, deadline - time.monotonic()))
                if proc.is_alive():
                    proc.kill()
                    proc.join()
            return 0
        finally:
            self.sock.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)


def run_workers(settings: Settings, count: int) -> None:
    """Serve the proxy from `count` processes on `settings.proxy_host:proxy_port`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        supervisor = Supervisor(settings, count)
    except OSError as exc:  # the port is taken, the address is not this machine's
        address = f"{settings.proxy_host}:{settings.proxy_port}"
        sys.stderr.write(f"error: cannot listen on {address}: {exc.strerror or exc}\n")
        raise SystemExit(1) from None
    raise SystemExit(supervisor.run())
