"""What a node's processes hold, its agents apart: memory (RSS, PSS), threads, descriptors, the
PostgreSQL and Redis connections, CPU (`bench.live_sessions`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil


def _pss(proc: psutil.Process) -> tuple[int, int]:
    """(RSS, PSS) in bytes; PSS from smaps_rollup (one read, not the whole smaps)."""
    try:
        rss = proc.memory_info().rss
        with open(f"/proc/{proc.pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return rss, int(line.split()[1]) * 1024
    except (psutil.Error, OSError):
        return 0, 0
    return rss, rss


def _label(proc: psutil.Process) -> str:
    """A node process's name: its Celery hostname (`-n stage.pool@node`), else its pid."""
    with contextlib.suppress(psutil.Error):
        argv = proc.cmdline()
        if "-n" in argv:
            return f"{argv[argv.index('-n') + 1].split('.')[0]}:{proc.pid}"
    return f"pid:{proc.pid}"


def _remote_ports(proc: psutil.Process) -> list[int]:
    try:
        return [c.raddr.port for c in proc.net_connections(kind="tcp") if c.raddr]
    except psutil.Error:
        return []


@dataclass
class Split:
    node: list[psutil.Process]
    agents: list[psutil.Process]


class Probe:
    """The processes under a node's supervisor, its agents (the `script`'s shells and their
    children) told apart from its own."""

    def __init__(self, root_pid: int, script: Path) -> None:
        self.root = psutil.Process(root_pid)
        self.script = str(script)
        self._node: list[psutil.Process] = [self.root]

    def split(self) -> Split:
        node: list[psutil.Process] = [self.root]
        agents: list[psutil.Process] = []
        pending = [self.root]
        while pending:
            parent = pending.pop()
            with contextlib.suppress(psutil.Error):
                for child in parent.children():
                    try:
                        is_agent = self.script in " ".join(child.cmdline())
                    except psutil.Error:
                        continue
                    if is_agent:
                        agents.append(child)
                        with contextlib.suppress(psutil.Error):
                            agents.extend(child.children(recursive=True))
                    else:
                        node.append(child)
                        pending.append(child)
        self._node = node
        return Split(node, agents)

    def snapshot(self) -> dict[str, Any]:
        split = self.split()
        node = [_pss(p) for p in split.node]
        agents = [_pss(p) for p in split.agents]
        threads = fds = 0
        pg = rd = 0
        by_process: dict[str, list[int]] = {}
        for p in split.node:
            t = f = 0
            with contextlib.suppress(psutil.Error):
                t, f = p.num_threads(), p.num_fds()
            ports = _remote_ports(p)
            threads, fds = threads + t, fds + f
            pg += ports.count(5432)
            rd += ports.count(6379)
            by_process[_label(p)] = [t, f, ports.count(5432), ports.count(6379)]
        return {
            "node_processes": len(split.node),
            "node_rss_mib": sum(r for r, _ in node) / 2**20,
            "node_pss_mib": sum(s for _, s in node) / 2**20,
            "node_threads": threads,
            "node_fds": fds,
            "node_pg_connections": pg,
            "node_redis_connections": rd,
            "agent_processes": len(split.agents),
            "agent_rss_mib": sum(r for r, _ in agents) / 2**20,
            "agent_pss_mib": sum(s for _, s in agents) / 2**20,
            "by_process": by_process,  # [threads, fds, PostgreSQL, Redis]
        }

    def pg_connections(self) -> int:
        """The node's own sockets to PostgreSQL, now (its processes as `split` last saw them)."""
        return sum(_remote_ports(p).count(5432) for p in self._node)

    def node_cpu_s(self) -> float:
        """User + system CPU of the node's own processes (what they reaped not included)."""
        total = 0.0
        for p in self._node:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total


def tree_cpu_s(pid: int) -> float:
    total = 0.0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
    return total
