"""bench/pipeline's CPU accounting: another job's agent counts among the other processes (alive
or reaped), the agents of the processes under test do not (their worker is billed on reaping)."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.pipeline import cpu
from polar_mq.runtimes.local import RUNTIME_TAG

SLEEPER = [sys.executable, "-c", "import time; time.sleep(30)"]


def test_other_jobs_agents_count_and_ours_do_not() -> None:
    env = {**os.environ, RUNTIME_TAG: "someone-elses-runtime"}
    theirs = subprocess.Popen(SLEEPER, env=env)
    # "ours": a tracked process whose child is a tagged agent
    spawn_agent = f"import subprocess,sys; subprocess.run({SLEEPER!r})"
    worker = subprocess.Popen([sys.executable, "-c", spawn_agent], env=env)
    children: set[int] = set()
    try:
        for _ in range(100):  # wait for the worker's agent to exist
            if cpu.tree_pids([worker.pid]) - {worker.pid}:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        children = cpu.tree_pids([worker.pid]) - {worker.pid}
        (ours,) = children
        snap = cpu.snapshot({"worker": worker.pid})
        others = snap.by_name[cpu.OTHERS]
        assert theirs.pid in others
        assert ours not in others and worker.pid not in others
        assert ours not in snap.by_name["worker"]  # billed to the worker when reaped
    finally:
        for pid in children:
            os.kill(pid, 9)
        for proc in (theirs, worker):
            proc.kill()
            proc.wait()
