"""The network of the namespace test bed: a bridge, one namespace per host, veth cables, faults.

Layout (`tag` is unique per bed, `sub` a free /24 of 10.213.0.0/16):

    root namespace: bridge pmqb<tag>  10.213.<sub>.1/24   (the head: forwarders, API, proxy)
    namespace pmq-<tag>-h<i>: eth0    10.213.<sub>.<10+i>/24, lo up, no default route

Hosts reach the head's address and nothing else (no route out, no forwarding or NAT added).
A partition takes the root-side end of a host's cable down (packets vanish silently, as when a
switch port dies; TCP connections resume when it comes back), a slow link is a netem qdisc on
both ends. Every bed records what it created in `REGISTRY` with its owner's pid, so a bed whose
owner was killed (a test run interrupted hard) is removed by the next bed that starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REGISTRY = Path("/run/polar_mq-netns")
SUPERNET = "10.213"


def ip(*args: str, ns: str | None = None, check: bool = True) -> str:
    """Run `ip ARGS` (inside namespace `ns` when given); its output."""
    argv = ["ip", *args] if ns is None else ["ip", "netns", "exec", ns, "ip", *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def tc(*args: str, ns: str | None = None) -> None:
    """Run `tc ARGS` (inside namespace `ns` when given); CalledProcessError on failure."""
    argv = ["tc", *args] if ns is None else ["ip", "netns", "exec", ns, "tc", *args]
    subprocess.run(argv, capture_output=True, check=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _used_subnets() -> set[int]:
    used = set()
    for line in ip("-o", "-4", "addr", "show").splitlines():
        for word in line.split():
            if word.startswith(f"{SUPERNET}."):
                used.add(int(word.split(".")[2]))
    for path in REGISTRY.glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            used.add(int(json.loads(path.read_text())["sub"]))
    return used


@dataclass
class NetHost:
    index: int
    ns: str
    address: str
    cable: str
    """The root-namespace end of the host's veth pair (attached to the bridge)."""


@dataclass
class Network:
    """A bridge and `hosts` namespaces; `teardown()` removes all of it (safe to repeat)."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    sub: int = 0
    hosts: list[NetHost] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"pmqb{self.tag}"

    @property
    def head_address(self) -> str:
        return f"{SUPERNET}.{self.sub}.1"

    def _record(self) -> None:
        state = {
            "owner": os.getpid(), "sub": self.sub, "bridge": self.bridge,
            "namespaces": [h.ns for h in self.hosts], "cables": [h.cable for h in self.hosts],
        }  # fmt: skip
        (REGISTRY / f"{self.tag}.json").write_text(json.dumps(state))

    def create(self, count: int) -> Network:
        REGISTRY.mkdir(parents=True, exist_ok=True)
        with (REGISTRY / ".lock").open("w") as lock:  # beds of parallel test workers
            fcntl.flock(lock, fcntl.LOCK_EX)
            reap_stale()
            free = sorted(set(range(1, 255)) - _used_subnets())
            if not free:
                raise RuntimeError(f"no free /24 left in {SUPERNET}.0.0/16")
            self.sub = free[0]
            self._record()  # first, so that a crash half-way is reaped too
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.head_address}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i in range(1, count + 1):
            host = NetHost(i, f"pmq-{self.tag}-h{i}", f"{SUPERNET}.{self.sub}.{10 + i}",
                           f"pmq{self.tag}h{i}")  # fmt: skip
            self.hosts.append(host)
            self._record()
            ip("netns", "add", host.ns)
            ip("link", "add", host.cable, "type", "veth", "peer", "name", f"{host.cable}p")
            ip("link", "set", f"{host.cable}p", "netns", host.ns)
            ip("link", "set", f"{host.cable}p", "name", "eth0", ns=host.ns)
            ip("link", "set", "lo", "up", ns=host.ns)
            ip("addr", "add", f"{host.address}/24", "dev", "eth0", ns=host.ns)
            ip("link", "set", "eth0", "up", ns=host.ns)
            ip("link", "set", host.cable, "master", self.bridge)
            ip("link", "set", host.cable, "up")
        return self

    def cut(self, host: NetHost) -> None:
        """Partition `host`: its cable goes down; nothing is reset, packets are just lost."""
        ip("link", "set", host.cable, "down")

    def heal(self, host: NetHost) -> None:
        ip("link", "set", host.cable, "up")

    def slow(
        self, host: NetHost, delay_ms: float, jitter_ms: float = 0.0, loss_pct: float = 0.0,
        rate_kbit: int = 256,
    ) -> str:  # fmt: skip
        """Slow the host's cable on both ends; the qdisc used. netem (`delay_ms` each way,
        jitter, loss) when the kernel has it, else a token bucket of `rate_kbit` (kernels built
        without sch_netem, like this machine's: a slow link, not a long one)."""
        netem = ["netem", "delay", f"{delay_ms}ms", f"{jitter_ms}ms", "loss", f"{loss_pct}%"]
        tbf = ["tbf", "rate", f"{rate_kbit}kbit", "burst", "16kbit", "latency", "500ms"]
        for spec in (netem, tbf):
            try:
                tc("qdisc", "replace", "dev", host.cable, "root", *spec)
                tc("qdisc", "replace", "dev", "eth0", "root", *spec, ns=host.ns)
            except subprocess.CalledProcessError:
                continue
            return spec[0]
        raise RuntimeError("neither netem nor tbf qdiscs are available")

    def unslow(self, host: NetHost) -> None:
        for ns, dev in ((None, host.cable), (host.ns, "eth0")):
            with contextlib.suppress(subprocess.CalledProcessError):
                tc("qdisc", "del", "dev", dev, "root", ns=ns)

    def teardown(self) -> None:
        _remove(self.bridge, [h.ns for h in self.hosts], [h.cable for h in self.hosts])
        with contextlib.suppress(FileNotFoundError):
            (REGISTRY / f"{self.tag}.json").unlink()


def _remove(bridge: str, namespaces: list[str], cables: list[str]) -> None:
    """Delete namespaces (their veth ends go with them), cables and the bridge; ignore absent."""
    for ns in namespaces:
        ip("netns", "del", ns, check=False)
    for cable in cables:
        ip("link", "del", cable, check=False)
    ip("link", "del", bridge, check=False)


def namespace_pids(ns: str) -> list[int]:
    """Processes whose network namespace is `ns`."""
    return [int(p) for p in ip("netns", "pids", ns, check=False).split()]


def reap_stale() -> list[str]:
    """Remove beds whose owner process is gone (killed before its teardown); their tags."""
    reaped = []
    for path in REGISTRY.glob("*.json"):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if _alive(int(state["owner"])):
            continue
        for ns in state["namespaces"]:
            for pid in namespace_pids(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
        _remove(state["bridge"], state["namespaces"], state["cables"])
        path.unlink(missing_ok=True)
        reaped.append(path.stem)
    return reaped
