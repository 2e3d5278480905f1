"""A private RabbitMQ node per scenario: its own node name, ports, Mnesia directory and cookie.

Scenarios that restart or stop the broker must not restart the machine's shared RabbitMQ (other
tests publish to it at the same time), so each gets a node of its own, as `private_redis.py`
does for Redis. The node keeps its Mnesia directory across `stop()`/`start()`, like a production
broker restarted in place: durable queues and persistent messages survive the restart, while
every connection (and every unacked delivery) is cut.

The node is started with the package's unwrapped `rabbitmq-server` script (the one in `/usr/sbin`
switches to the `rabbitmq` user, who could not write the test's directory), with the machine's
`rabbitmq.conf` and `rabbitmq-env.conf` replaced by private ones: the shared ones name the shared
node and its port.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import amqp

from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from tests.reliability.support import wait_until

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")


def rabbitmq_script(name: str) -> str | None:
    """The path of a RabbitMQ script that runs as the caller, or None when not installed."""
    direct = RABBITMQ_BIN / name
    if direct.is_file() and os.access(direct, os.X_OK):
        return str(direct)
    return shutil.which(name)


def rabbitmq_available() -> bool:
    return rabbitmq_script("rabbitmq-server") is not None


class PrivateRabbitMQ:
    def __init__(self, base_dir: Path) -> None:
        self.port = free_port()
        self.dist_port = free_port()
        self.nodename = f"polarmq{self.port}@localhost"
        self.base_dir = base_dir
        self.proc: ManagedProcess | None = None
        base_dir.mkdir(parents=True, exist_ok=True)
        (base_dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.port}\n"
            "loopback_users.guest = true\n"
            # a test box's disk may be nearly full: do not block publishers over it
            "disk_free_limit.absolute = 1MB\n"
        )
        (base_dir / "rabbitmq-env.conf").write_text("")
        (base_dir / "enabled_plugins").write_text("[].\n")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def env(self) -> dict[str, str]:
        """The environment of the node and of `rabbitmqctl` aimed at it (the cookie is in HOME)."""
        base = self.base_dir
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(base),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
        }

    def start(self) -> None:
        server = rabbitmq_script("rabbitmq-server")
        assert server is not None, "rabbitmq-server is not installed"
        self.proc = ManagedProcess("rabbitmq", [server], self.env(), self.base_dir).start()
        wait_until(self._up, 90, "RabbitMQ to accept AMQP connections", poll_s=0.3)

    def stop(self) -> None:
        """A clean shutdown (SIGTERM to the node's process group): state is kept on disk."""
        if self.proc is not None:
            self.proc.stop(grace_s=30.0)

    def queue_arguments(self) -> dict[str, dict[str, object]]:
        """Every queue of the node with the arguments it was declared with (`rabbitmqctl`: an
        Erlang VM starts for each call, slow on a loaded host)."""
        ctl = rabbitmq_script("rabbitmqctl")
        assert ctl is not None
        out = subprocess.run(
            [ctl, "-n", self.nodename, "-q", "list_queues", "name", "arguments",
             "--formatter", "json"],
            env=self.env(), capture_output=True, text=True, timeout=180, check=True,
        ).stdout  # fmt: skip
        return {row["name"]: _arguments(row["arguments"]) for row in json.loads(out)}

    def _up(self) -> bool:
        if self.proc is not None and not self.proc.alive():
            raise RuntimeError(f"RabbitMQ exited before it was up:\n{self.proc.log_tail()}")
        conn = amqp.Connection(
            host=f"127.0.0.1:{self.port}", userid="guest", password="guest", connect_timeout=2
        )
        try:
            conn.connect()
        except (OSError, amqp.exceptions.AMQPError):
            return False
        conn.close()
        return True


def _arguments(raw: object) -> dict[str, object]:
    """rabbitmqctl's JSON gives arguments as a list of [name, type, value] or as a mapping."""
    if isinstance(raw, dict):
        return dict(raw)
    result: dict[str, object] = {}
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, list) and len(item) == 3:
            result[str(item[0])] = item[2]
    return result
