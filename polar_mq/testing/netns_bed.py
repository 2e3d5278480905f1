"""A multi-host test bed on one machine: each "host" is a network namespace with its own node.

Why namespaces: a node on another host differs from a process on this one in what it can lose
at once. Killing a host here SIGKILLs every process in its namespace (supervisor, stage workers,
agents, its proxy if it has one) with no SIGTERM anywhere, and leaves its runtime directories
behind; a partition drops every packet between the host and the head, so its connections to
PostgreSQL, the broker and the proxy stall (no reset, no error) and resume when the cable is
back — which is what tests whether fencing by lease and attempt holds across hosts.

The head (API, sweeper, proxy, fake engine: a `LocalStack` of the test's) stays in the root
namespace. Its proxy listens on the bridge address (`head_settings`). PostgreSQL and the broker
keep listening on 127.0.0.1; a forwarder process (`tcp_forward`) on the bridge address relays
to them, so nothing about the machine's services changes. Each host gets settings of its own
(`host_settings`: forwarded URLs, its node name, runtime root and spill directory) and runs
`polar-mq worker --node h<i>` (janitor on), optionally with its own proxy and fake engine.

    with NetnsBed(tmp, hosts=3) as bed, LocalStack(bed.head_settings(base), logs) as head:
        ...head.proxy(), head.api(), head.sweeper()...
        bed.start_node(1); bed.kill_host(1); bed.partition(2, seconds=5); bed.slow(3, 50)

Needs root (CAP_NET_ADMIN) and `ip`/`tc`; `NetnsBed.available()` says whether it can run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.engine import make_url

from polar_mq.config import Settings
from polar_mq.infra.ports import free_port
from polar_mq.infra.processes import ManagedProcess
from polar_mq.lifecycle.stages import Stage
from polar_mq.stack.devstack import LocalStack
from polar_mq.testing.netns_net import NetHost, Network, namespace_pids
from polar_mq.workers.janitor import local_runtime_ids

LOOPBACK = ("127.0.0.1", "localhost")


class HostStack(LocalStack):
    """A `LocalStack` whose processes start inside one namespace (`ip netns exec` execs the
    program in place, so each process's pid is the service's own). No fork server: a fork of
    a root-namespace server would land in the root namespace."""

    def __init__(self, net: NetHost, settings: Settings, log_dir: Path, env: Mapping[str, str]):
        super().__init__(settings, log_dir, extra_env=env, fork=False)
        self.ns = net.ns
        self.address = net.address

    def _spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        return super()._spawn(name, ["ip", "netns", "exec", self.ns, *argv], env)

    def fake_upstream(self, port: int, *, wait: bool = True, **latency: Any) -> ManagedProcess:
        """The fake engine on the host's address (the head can probe it there)."""
        argv = [sys.executable, "-m", "polar_mq.testing.fake_vllm", "--port", str(port),
                "--host", self.address]  # fmt: skip
        for key, value in latency.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        proc = self._spawn("fake-upstream", argv)
        return self._ready(proc, f"http://{self.address}:{port}/health", wait)


@dataclass
class BedHost:
    net: NetHost
    settings: Settings
    stack: HostStack
    node: ManagedProcess | None = None
    kills: int = 0
    left_behind: set[str] = field(default_factory=set)
    """Runtime ids found on the host when it was last killed (what a reboot must reclaim)."""

    @property
    def name(self) -> str:
        return f"h{self.net.index}"

    @property
    def runtime_root(self) -> Path:
        return self.settings.runtime_root


class NetnsBed:
    """`hosts` namespaces on a bridge, a forwarder to the head's services, teardown guaranteed."""

    def __init__(self, workdir: Path, hosts: int, env: Mapping[str, str] | None = None) -> None:
        self.workdir = workdir
        self.count = hosts
        self.env = dict(env or {})
        self.network = Network()
        self.hosts: dict[int, BedHost] = {}
        self._head: Settings | None = None
        self._pairs: dict[tuple[str, int], int] = {}
        self._forwarder: ManagedProcess | None = None

    @staticmethod
    def available() -> bool:
        return os.geteuid() == 0 and shutil.which("ip") is not None and bool(shutil.which("tc"))

    @property
    def head_address(self) -> str:
        return self.network.head_address

    def start(self) -> NetnsBed:
        try:
            self.network.create(self.count)
        except BaseException:
            self.network.teardown()
            raise
        return self

    # --- settings ---------------------------------------------------------------------------

    def head_settings(self, base: Settings, admin_token: str = "bed-admin-" + "x" * 20) -> Settings:
        """`base` with the proxy on the bridge address (a non-loopback bind needs an admin
        token), and the forwarder started for its database and broker."""
        token = base.proxy_admin_token or admin_token
        self._head = base.model_copy(
            update={"proxy_host": self.head_address, "proxy_admin_token": token}
        )
        for url in (base.database_url, base.broker_url, base.proxy_redis_url):
            if url:
                self._forward(url)
        self._start_forwarder()
        return self._head

    def _target(self, url: str) -> tuple[str, int] | None:
        if url.startswith(("postgresql", "sqlite")):
            parsed = make_url(url)
            return (parsed.host, parsed.port or 5432) if parsed.host in LOOPBACK else None
        split = urlsplit(url)
        default = 5672 if split.scheme.startswith("amqp") else 6379
        host = split.hostname or ""
        return (host, split.port or default) if host in LOOPBACK else None

    def _forward(self, url: str) -> None:
        target = self._target(url)
        if target is not None and target not in self._pairs:
            self._pairs[target] = free_port()

    def _rewrite(self, url: str | None) -> str | None:
        """`url` as a host reaches it: a loopback service through the forwarder."""
        if url is None or (target := self._target(url)) is None:
            return url
        port = self._pairs[target]
        if url.startswith("postgresql"):
            return make_url(url).set(host=self.head_address, port=port).render_as_string(False)
        split = urlsplit(url)
        auth = split.netloc.rpartition("@")[0]
        netloc = f"{auth}@" if auth else ""
        return urlunsplit(split._replace(netloc=f"{netloc}{self.head_address}:{port}"))

    def _start_forwarder(self) -> None:
        if self._forwarder is not None:
            return
        pairs = [f"{self.head_address}:{p}={h}:{port}" for (h, port), p in self._pairs.items()]
        argv = [sys.executable, "-m", "polar_mq.testing.tcp_forward", *pairs]
        self._forwarder = ManagedProcess("forwarder", argv, os.environ, self.workdir / "logs")
        self._forwarder.start()
        deadline = time.monotonic() + 30
        while "ready" not in self._forwarder.log_tail():
            if not self._forwarder.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"forwarder failed: {self._forwarder.log_tail()}")
            time.sleep(0.05)

    def host_settings(self, index: int, own_proxy: bool = False) -> Settings:
        """Host `index`'s settings: the head's, reached through the bridge, with its own node
        name, runtime root and spill directory (and its own proxy if `own_proxy`)."""
        assert self._head is not None, "call head_settings() first"
        net = self.network.hosts[index - 1]
        root = self.workdir / f"h{index}"
        update: dict[str, object] = {
            "database_url": self._rewrite(self._head.database_url),
            "broker_url": self._rewrite(self._head.broker_url),
            "proxy_redis_url": self._rewrite(self._head.proxy_redis_url),
            "node_name": f"h{index}",
            "runtime_root": root / "runtimes",
            "proxy_spill_dir": root / "proxy-spill",
        }
        if own_proxy:
            upstream = free_port()
            update |= {
                "proxy_host": net.address, "proxy_port": free_port(),
                "upstream_url": f"http://{net.address}:{upstream}", "upstream_urls": [],
                "proxy_admin_urls": [],
            }  # fmt: skip
        return self._head.model_copy(update=update)

    # --- hosts --------------------------------------------------------------------------------

    def start_node(
        self,
        index: int,
        concurrency: Mapping[Stage, int] | None = None,
        own_proxy: bool = False,
        fake: Mapping[str, object] | None = None,
    ) -> BedHost:
        """Boot host `index` (again, after a kill: same runtime root, so its janitor reclaims
        what the dead node left): its node, and with `own_proxy` its proxy and fake engine."""
        host = self.hosts.get(index)
        if host is None:
            settings = self.host_settings(index, own_proxy)
            net = self.network.hosts[index - 1]
            stack = HostStack(net, settings, self.workdir / "logs" / f"h{index}", self.env)
            host = self.hosts[index] = BedHost(net, settings, stack)
        if own_proxy:
            port = urlsplit(host.settings.upstream_url).port
            assert port is not None
            host.stack.fake_upstream(port, wait=False, **(fake or {}))
            host.stack.proxy(wait=False)
            host.stack.wait_ready()
        host.node = host.stack.node(host.name, concurrency)
        return host

    def processes(self, index: int) -> list[int]:
        return namespace_pids(self.network.hosts[index - 1].ns)

    def kill_host(self, index: int) -> set[str]:
        """SIGKILL every process in host `index`'s namespace, until none is left; the runtime
        ids it leaves behind (directories stay, as on a host that lost power)."""
        host = self.hosts[index]
        deadline = time.monotonic() + 30
        while pids := self.processes(index):  # a fork may land between two passes
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise RuntimeError(f"host {index}: processes survive SIGKILL: {pids}")
            time.sleep(0.05)
        for proc in host.stack.processes:
            proc.alive()  # reap our children among them
        host.stack.processes.clear()
        host.node = None
        host.kills += 1
        host.left_behind = local_runtime_ids(host.runtime_root)
        return host.left_behind

    def cut(self, index: int) -> None:
        self.network.cut(self.network.hosts[index - 1])

    def heal(self, index: int) -> None:
        self.network.heal(self.network.hosts[index - 1])

    def partition(self, index: int, seconds: float) -> None:
        """Cut host `index` off for `seconds`, then reconnect it (blocks meanwhile)."""
        self.cut(index)
        try:
            time.sleep(seconds)
        finally:
            self.heal(index)

    def slow(self, index: int, delay_ms: float, **options: Any) -> str:
        """Slow host `index`'s link (`Network.slow`); the qdisc used (netem, or tbf without)."""
        return self.network.slow(self.network.hosts[index - 1], delay_ms, **options)

    def unslow(self, index: int) -> None:
        self.network.unslow(self.network.hosts[index - 1])

    # --- teardown -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Kill every host's processes, stop the forwarder, remove namespaces, cables, bridge."""
        try:
            for index in range(1, self.count + 1):
                if index - 1 < len(self.network.hosts):
                    self.heal(index)
                    if index in self.hosts:
                        self.kill_host(index)
                    else:
                        for pid in self.processes(index):
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGKILL)
            if self._forwarder is not None:
                self._forwarder.stop(grace_s=5.0)
        finally:
            self.network.teardown()

    def __enter__(self) -> NetnsBed:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
