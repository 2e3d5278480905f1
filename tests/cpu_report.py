"""`-p tests.cpu_report --cpu-report FILE`: the CPU each test costs, with the processes it started.

The suite is CPU-bound on 2 cores (its stacks start a dozen Python processes each), so wall-clock
durations under xdist say little about where the time goes: a test waiting on a busy machine looks
as long as one keeping it busy. Each test's share is the rise of `getrusage(SELF)` plus
`getrusage(CHILDREN)` across its setup, call and teardown: children count once they are reaped,
with their own reaped descendants, which the stacks do at teardown (a module's shared stack is
billed to the test that tears it down: read the report per module). Services forked from the
session's fork server (`polar_mq.infra.forking`) are its children, not ours: the rise of the fork
server's own reaped-children time (`/proc/<pid>/stat`) is added. Every process appends JSON
lines to FILE; `python -m tests.cpu_report FILE` prints the costliest modules and tests.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest


def _fork_server_children_s() -> float:
    """CPU of the fork server's reaped children (the forked services), 0 before it starts."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    cutime, cstime = int(fields[13]), int(fields[14])  # fields 16 and 17 of proc(5)
    return (cutime + cstime) / os.sysconf("SC_CLK_TCK")


def _cpu_s() -> float:
    total = _fork_server_children_s()
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-report", default=None, help="append per-test CPU seconds to FILE")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, Any, None]:
    target = item.config.getoption("--cpu-report")
    if not target:
        yield
        return
    before, started = _cpu_s(), time.time()
    yield
    line = {
        "test": item.nodeid,
        "cpu_s": round(_cpu_s() - before, 3),
        "pid": os.getpid(),
        "start": round(started, 3),
        "end": round(time.time(), 3),
    }
    with Path(target).open("a") as out:
        out.write(json.dumps(line) + "\n")


def summarize(path: Path, top: int = 40) -> str:
    tests: dict[str, float] = {}
    for raw in path.read_text().splitlines():
        record = json.loads(raw)
        tests[record["test"]] = tests.get(record["test"], 0.0) + record["cpu_s"]
    modules: dict[str, float] = defaultdict(float)
    for name, cpu in tests.items():
        modules[name.split("::", 1)[0]] += cpu
    lines = [f"{len(tests)} tests, {sum(tests.values()) / 60:.1f} CPU-min in all", "", "modules:"]
    for name, cpu in sorted(modules.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{cpu:8.1f} s  {name}")
    lines += ["", "tests:"]
    for name, cpu in sorted(tests.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{cpu:8.1f} s  {name}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 40))
