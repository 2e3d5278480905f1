"""Where a load run's machine time went: the proxy, the engine, the load generator, PostgreSQL,
Redis and the rest, in cores (CPU seconds per wall second).

`--workers 2` can only beat one worker by what the machine has left: when the engine, `wrk` and
the database already take most of the two cores at one worker's rate, a second proxy process has
nothing to run on. This split says how close a run was to that, and `ceiling` turns it into the
most calls/s the machine could serve at the measured CPU per call of every process involved.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bench.pipeline.cpu import find_processes, machine_busy_s, tree_cpu

Sampler = Callable[[], float]
"""CPU seconds so far of one group of processes."""


def children_s() -> float:
    """CPU of this process's reaped children: `wrk`, run and waited for by the bench."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tree(pid: int) -> Sampler:
    return lambda: sum(tree_cpu(pid).values())


def named(name: str, cmdline_contains: str | None = None) -> Sampler:
    return lambda: sum(find_processes(name, cmdline_contains).values())


@dataclass
class MachineSplit:
    """Cores used by each group over a window, and the machine's busy cores in all."""

    wall_s: float
    cores: dict[str, float]
    busy: float

    @property
    def other(self) -> float:
        return max(0.0, self.busy - sum(self.cores.values()))

    def ceiling(self, calls: int, machine_cores: int) -> float:
        """Calls/s at which the measured CPU per call of every process (busy time over calls)
        would fill all of the machine's cores."""
        cpu_per_call = self.busy * self.wall_s / max(calls, 1)
        return machine_cores / cpu_per_call if cpu_per_call > 0 else float("inf")


class MachineWindow:
    """Samples the groups before and after a timed run (`with MachineWindow(groups) as w`)."""

    def __init__(self, groups: Mapping[str, Sampler]) -> None:
        self.groups = {**groups, "wrk": children_s}
        self.split: MachineSplit | None = None

    def __enter__(self) -> MachineWindow:
        self._before = {name: sample() for name, sample in self.groups.items()}
        self._busy = machine_busy_s()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._t0
        busy = machine_busy_s() - self._busy
        cores = {
            name: max(0.0, sample() - self._before[name]) / wall
            for name, sample in self.groups.items()
        }
        self.split = MachineSplit(wall, cores, busy / wall)
