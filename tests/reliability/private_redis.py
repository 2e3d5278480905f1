"""A private `redis-server` per scenario, on a free port, with no persistence (like this machine's).

Scenarios that restart the broker or depend on kombu's restore of unacked messages get their own
server: on the shared Redis, another test's killed worker can leave kombu's restore mutex held for
its full expiry (300 s), which delays every redelivery past the visibility timeout.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from tests.reliability.support import wait_until


class PrivateRedis:
    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.log_dir = log_dir
        self.proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [
            shutil.which("redis-server") or "redis-server",
            "--port", str(self.port), "--save", "", "--appendonly", "no",
        ]  # fmt: skip
        self.proc = ManagedProcess("redis", argv, {}, self.log_dir).start()
        wait_until(self._up, 10, "redis to accept connections")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def _up(self) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0
