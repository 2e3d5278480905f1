"""The chaos soak's own PostgreSQL and brokers, so that restarting them hits no one else.

The machine's PostgreSQL, Redis and RabbitMQ serve every other helper and test at once: the soak
must not restart them. It starts private ones instead, on free loopback ports (the namespace
bed's forwarder relays hosts to them like to the machine's):

- `PrivatePostgres`: a cluster of its own (`initdb` into a temporary directory owned by the
  `postgres` user, `pg_ctl` as that user, since PostgreSQL refuses to run as root). A restart is
  `pg_ctl restart -m immediate`: every backend dies at once without a checkpoint and the server
  runs crash recovery, as after a power cut of the database host; each polar_mq connection then
  fails and must reconnect.
- `PrivateRedis` / the RabbitMQ node of `tests/reliability/private_rabbitmq.py`: a restart kills
  the process (SIGKILL) and starts it again on the same port. Redis runs like the machine's, with
  no persistence, so queued messages, call receipts and shared counters are gone: recovery must
  come from the sweeper's republish and the database floors. RabbitMQ keeps its Mnesia
  directory (durable queues, persistent messages survive; unacked deliveries are redelivered).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess

PG_USER = "postgres"


def _wait(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _pg_bin(name: str) -> str:
    """A server program (`initdb`, `pg_ctl`): Debian keeps them out of PATH."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name)
    for directory in reversed(versions):
        if (directory / name).exists():
            return str(directory / name)
    raise RuntimeError(f"{name} not found (install the PostgreSQL server package)")


class PrivatePostgres:
    """A throw-away PostgreSQL cluster on a free port (module docstring)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="polar-mq-chaos-pg-", dir="/tmp"))
        self.data = self.base / "data"
        user = pwd.getpwnam(PG_USER)
        os.chown(self.base, user.pw_uid, user.pw_gid)
        self.restarts = 0

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *argv: str, timeout_s: float = 120) -> None:
        """Run a server program as `postgres`. No pipes: a postmaster it starts would inherit
        them and hold them open (a restart's server logs to `-l`, like the first start's)."""
        with (self.base / "ctl.log").open("ab") as log:
            subprocess.run(
                ["runuser", "-u", PG_USER, "--", *argv],
                check=True,
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.base,
            )

    def start(self) -> PrivatePostgres:
        if not self.data.exists():
            self._as_postgres(
                _pg_bin("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                "--no-sync", "-E", "UTF8",
            )  # fmt: skip
        options = (
            f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 "
            "-c max_connections=400 -c shared_buffers=128MB"
        )
        self._as_postgres(
            _pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.base / "log"),
            "-o", options, "-w", "-t", "60", "start",
        )  # fmt: skip
        return self

    def restart(self) -> None:
        """Every backend dies at once; the server recovers from its WAL and listens again."""
        self._as_postgres(
            _pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.base / "log"), "-m",
            "immediate", "-w", "-t", "60", "restart",
        )  # fmt: skip
        self.restarts += 1

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._as_postgres(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "stop")
        shutil.rmtree(self.base, ignore_errors=True)


class PrivateRedis:
    """A Redis without persistence, like the machine's, restarted by SIGKILL."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.log_dir = log_dir
        self.proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        redis = shutil.which("redis-server") or "redis-server"
        argv = [redis, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--maxclients", "4000"]  # fmt: skip
        self.proc = ManagedProcess("redis", argv, {}, self.log_dir).start()
        _wait(lambda: _listening(self.port), 20, "the private Redis")
        return self

    def restart(self) -> None:
        self.stop(signal.SIGKILL)
        self.start()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            self.proc.stop(sig)


class PrivateBroker:
    """The soak's broker: its private Redis, or a private RabbitMQ node."""

    def __init__(self, kind: str, redis: PrivateRedis, workdir: Path) -> None:
        self.kind = kind
        self.redis = redis
        self.rabbit = None
        if kind == "amqp":  # the reliability suite's node wrapper (own name, ports, Mnesia)
            from tests.reliability.private_rabbitmq import PrivateRabbitMQ

            self.rabbit = PrivateRabbitMQ(workdir / "rabbitmq")

    @property
    def url(self) -> str:
        return self.rabbit.url if self.rabbit is not None else self.redis.url

    def start(self) -> None:
        if self.rabbit is not None:
            self.rabbit.start()

    def restart(self) -> None:
        if self.rabbit is None:
            self.redis.restart()
            return
        proc = self.rabbit.proc
        if proc is not None:
            proc.stop(signal.SIGKILL)
        self.rabbit.start()

    def stop(self) -> None:
        if self.rabbit is not None:
            self.rabbit.stop()
