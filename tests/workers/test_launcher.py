"""Worker planning (one Celery process per stage, own queue and concurrency) and draining."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from polar_mq.config import Settings
from polar_mq.lifecycle.stages import Stage
from polar_mq.workers import launcher
from polar_mq.workers.launcher import StageWorker, parse_concurrency, parse_stages, plan_workers


def test_plan_routes_stages_to_pool_and_node_queues() -> None:
    settings = Settings(queue_prefix="q", pool="gpu", node_name="n7")
    plan = plan_workers(
        settings, parse_stages("prepare,run_agent,build,evaluate"),
        parse_concurrency("run_agent=16"), "threads",
    )  # fmt: skip
    queues = {w.stage: w.queue for w in plan}
    assert queues == {
        Stage.PREPARE: "q.prepare.gpu",
        Stage.RUN_AGENT: "q.run_agent.n7",
        Stage.BUILD: "q.build.gpu",
        Stage.EVALUATE: "q.evaluate.n7",
    }
    run_agent = next(w for w in plan if w.stage is Stage.RUN_AGENT)
    assert run_agent.concurrency == 16
    assert "-Q" in run_agent.argv() and "q.run_agent.n7" in run_agent.argv()


@pytest.mark.parametrize("bad", ["run_agent", "run_agent=0", "nope=3", "run_agent=x"])
def test_bad_concurrency_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        parse_concurrency(bad)


def test_unknown_stage() -> None:
    with pytest.raises(ValueError, match="unknown stage"):
        parse_stages("prepare,cook")


def test_settings_refuse_visibility_shorter_than_agent_timeout() -> None:
    with pytest.raises(ValueError, match="VISIBILITY_TIMEOUT"):
        Settings(visibility_timeout_s=100, max_agent_timeout_s=200)


SLEEPER = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture()
def sleepers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Stage workers replaced by sleepers that exit 0 on SIGTERM; signal handlers restored."""
    spawned: list[subprocess.Popen[bytes]] = []

    def spawn(
        worker: StageWorker, env: object = None, start: str = "exec"
    ) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        spawned.append(proc)  # its SIGTERM handler is in place (a loaded machine starts slowly)
        return proc

    monkeypatch.setattr(launcher, "spawn_one", spawn)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield spawned
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    for proc in spawned:
        proc.kill()
        proc.wait()


def _plan() -> list[StageWorker]:
    settings = Settings(queue_prefix="q", pool="p", node_name="n")
    return plan_workers(settings, list(Stage), parse_concurrency(None), "threads")


def test_sigterm_drains_prepare_first_then_the_rest(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    seen: list[tuple[int, bool, bool]] = []
    left = iter([2, 1, 0])

    def remaining() -> int:
        prepare, run_agent = sleepers[0], sleepers[1]
        count = next(left)
        seen.append((count, prepare.poll() is None, run_agent.poll() is None))
        return count

    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    drain = launcher.DrainPolicy(timeout_s=30, remaining=remaining, poll_s=0.05)
    assert launcher.supervise(_plan(), poll_s=0.05, drain=drain) == launcher.DRAINED
    # prepare had stopped before the node was counted; the others worked until it was empty
    assert seen == [(2, False, True), (1, False, True), (0, False, True)]
    assert len(sleepers) == 4 and all(p.poll() == 0 for p in sleepers)


def test_drain_timeout_stops_what_is_left(sleepers: list[subprocess.Popen[bytes]]) -> None:
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    drain = launcher.DrainPolicy(timeout_s=0.5, remaining=lambda: 3, poll_s=0.05, kill_grace_s=2)
    began = time.monotonic()
    assert launcher.supervise(_plan(), poll_s=0.05, drain=drain) == launcher.DRAIN_TIMED_OUT
    assert time.monotonic() - began < 5
    assert len(sleepers) == 4 and all(p.poll() is not None for p in sleepers)
