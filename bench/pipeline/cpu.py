"""CPU accounting of the processes under test, as deltas of psutil `cpu_times()` (user + system).

A tracked process counts itself and its live descendants, except the rollouts' agent processes
(recognised by the runtime tag polar_mq's local runtime puts in their environment). The children_*
fields are never used: they would add the agents (and anything else reaped) to the worker's bill.
A descendant seen at the end but not at the start is counted from zero (it was born inside the
window); one that vanished before the end is reported as lost (its CPU cannot be read any more).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import psutil

from polar_mq.runtimes.local import RUNTIME_TAG

_AGENT_NEEDLE = f"\0{RUNTIME_TAG}=".encode()
BENCH = "bench process (submit, polling, these scans)"
OTHERS = "other processes (other jobs, kernel threads)"
KERNEL = "kernel interrupts (irq + softirq)"
GLOBAL = (BENCH, OTHERS, KERNEL)
"""Groups every snapshot adds, so the machine's busy time is attributed to named processes."""


def _is_agent(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return _AGENT_NEEDLE in b"\0" + handle.read()
    except OSError:
        return False


def _cpu(proc: psutil.Process) -> float | None:
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return None
    return float(times.user + times.system)


def _tree(pid: int) -> list[psutil.Process]:
    """`pid` and its descendants, without the rollouts' agents."""
    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    return [p for p in members if p.pid == pid or not _is_agent(p.pid)]


def _cpu_by_pid(members: list[psutil.Process]) -> dict[int, float]:
    result: dict[int, float] = {}
    for proc in members:
        value = _cpu(proc)
        if value is not None:
            result[proc.pid] = value
    return result


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of `pid` and of its non-agent descendants, by pid."""
    return _cpu_by_pid(_tree(pid))


def thread_split(members: list[psutil.Process]) -> tuple[float, float]:
    """CPU seconds of a tracked tree's `members` (`_tree`) as (main threads, other threads).

    In a stage worker the main thread is Celery's consumer (receive, reserve, the event loop)
    and the other threads its pool (the stage bodies, their acks and publishes); in the proxy,
    the event loop against its writer and resolver threads. A process's total cannot tell a
    costly consumer from a costly stage body; this can (py-spy's samples could not: it
    over-attributes to a thread that holds the GIL while descheduled). A thread that ended
    inside the window drops out of the split (not of the process total)."""
    main = other = 0.0
    for proc in members:
        try:
            threads = proc.threads()
        except psutil.Error:
            continue
        for thread in threads:
            spent = float(thread.user_time + thread.system_time)
            if thread.id == proc.pid:
                main += spent
            else:
                other += spent
    return main, other


@dataclass
class CpuSnapshot:
    by_name: dict[str, dict[int, float]] = field(default_factory=dict)
    threads: dict[str, tuple[float, float]] = field(default_factory=dict)
    """(main, other threads) CPU seconds of each tracked tree (`thread_split`)."""


@dataclass
class CpuDelta:
    seconds: dict[str, float]
    lost: dict[str, list[int]]
    threads: dict[str, tuple[float, float]] = field(default_factory=dict)

    def total(self, names: list[str] | None = None) -> float:
        return sum(v for k, v in self.seconds.items() if names is None or k in names)


def snapshot(
    pids: Mapping[str, int], extra: Mapping[str, Callable[[], dict[int, float]]] | None = None
) -> CpuSnapshot:
    """Trees of the named pids, plus groups found by the `extra` scanners (e.g. PostgreSQL)."""
    trees = {name: _tree(pid) for name, pid in pids.items()}  # one walk for both views
    threads = {name: thread_split(members) for name, members in trees.items()}
    by_name = {name: _cpu_by_pid(members) for name, members in trees.items()}
    for name, scan in (extra or {}).items():
        by_name[name] = scan()
    me = os.getpid()
    by_name[BENCH] = {me: _cpu(psutil.Process(me)) or 0.0}
    named = {pid for group in by_name.values() for pid in group}
    # the trees' agents are billed when their worker reaps them; other jobs' agents are theirs
    ours = tree_pids(list(pids.values()))
    by_name[OTHERS] = other_processes(lambda: named | ours)
    by_name[KERNEL] = kernel_irq_s()
    return CpuSnapshot(by_name, threads)


def delta(before: CpuSnapshot, after: CpuSnapshot) -> CpuDelta:
    seconds: dict[str, float] = {}
    lost: dict[str, list[int]] = {}
    for name, end in after.by_name.items():
        start = before.by_name.get(name, {})
        if name == OTHERS:  # own + reaped time is conserved when a process is reaped
            seconds[name] = sum(end.values()) - sum(start.values())
            continue
        seconds[name] = sum(value - start.get(pid, 0.0) for pid, value in end.items())
        gone = sorted(set(start) - set(end))
        if gone:
            lost[name] = gone
    threads = {
        name: (main - before.threads[name][0], other - before.threads[name][1])
        for name, (main, other) in after.threads.items()
        if name in before.threads
    }
    return CpuDelta(seconds, lost, threads)


def find_processes(name: str, cmdline_contains: str | None = None) -> dict[int, float]:
    """CPU seconds of every process called `name` (optionally whose cmdline has a substring)."""
    result: dict[int, float] = {}
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if proc.info["name"] != name:
                continue
            if cmdline_contains is not None:
                cmdline = " ".join(proc.info["cmdline"] or [])
                if cmdline_contains not in cmdline:
                    continue
            value = _cpu(proc)
        except psutil.Error:
            continue
        if value is not None:
            result[proc.pid] = value
    return result


def reaped_children_cpu(pids: list[int]) -> dict[int, float]:
    """CPU seconds of the waited-for children of `pids` (the agents and their shells)."""
    result: dict[int, float] = {}
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        result[pid] = float(times.children_user + times.children_system)
    return result


def tree_pids(pids: list[int]) -> set[int]:
    """`pids` and every live descendant of them."""
    found = set(pids)
    for pid in pids:
        try:
            found.update(p.pid for p in psutil.Process(pid).children(recursive=True))
        except psutil.Error:
            continue
    return found


def reaped_in_trees(pids: list[int]) -> dict[int, float]:
    """CPU seconds of the waited-for children of every non-agent process in the trees of
    `pids`: `polar-mq worker` supervises the Celery process that spawns (and reaps) the agents."""
    return reaped_children_cpu([p for p in tree_pids(pids) if not _is_agent(p)])


def other_processes(exclude: Callable[[], set[int]]) -> dict[int, float]:
    """CPU seconds of every other process of the machine (other jobs, kernel threads), own time
    plus the time of the children they reaped, so a short-lived process that started and ended
    inside the window is found through its parent. `exclude` holds the named groups and the
    trees of the processes under test (their agents are billed when their worker reaps them);
    the agents of other jobs on the machine count here, alive or reaped (skipping them, as this
    did, lost the CPU of every other job's agent still running at the end of the window: 26 %
    of the machine's busy time in one run next to another test run). The group's delta is the
    difference of its sums (`delta`): reaping moves a child's whole time to its parent, so the
    sum is conserved, whereas per-pid differences would bill a reaped child's earlier life to
    the window."""
    skip = exclude()
    result: dict[int, float] = {}
    for proc in psutil.process_iter():
        if proc.pid in skip:
            continue
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        result[proc.pid] = float(t.user + t.system + t.children_user + t.children_system)
    return result


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores, interrupts included)."""
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0))


def kernel_irq_s() -> dict[int, float]:
    """The machine's interrupt time (irq + softirq): kernel work no process is charged for."""
    t = psutil.cpu_times()
    return {0: float(getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0))}
