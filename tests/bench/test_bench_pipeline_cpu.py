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


SPINS_IN_A_THREAD = """
import threading, time
def spin():
    end = time.thread_time() + 0.6
    while time.thread_time() < end:
        pass
    print("spun", flush=True)
    time.sleep(30)  # alive at the second snapshot: an ended thread leaves the thread list
threading.Thread(target=spin).start()
time.sleep(30)
"""


def test_thread_split_tells_the_main_thread_from_the_others() -> None:
    """A process whose only busy thread is not its main one: the split bills that thread's CPU
    to "other threads" (a stage worker's pool), and a snapshot's delta carries the split."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SPINS_IN_A_THREAD], stdout=subprocess.PIPE, text=True
    )
    try:
        before = cpu.snapshot({"spinner": proc.pid})
        assert proc.stdout is not None and proc.stdout.readline() == "spun\n"
        delta = cpu.delta(before, cpu.snapshot({"spinner": proc.pid}))
        main, other = delta.threads["spinner"]
        assert other >= 0.5  # the spinning thread's 0.6 s, less what ran before the snapshot
        assert main < 0.2  # the main thread only sleeps
        assert abs(main + other - delta.seconds["spinner"]) < 0.05  # the same CPU, split
    finally:
        proc.kill()
        proc.wait()
