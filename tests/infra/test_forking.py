"""Processes forked from the fork server: a real Celery stage worker, as exec would start it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from polar_mq.config import Settings
from polar_mq.infra.forking import ForkedProcess, can_fork, preload
from polar_mq.infra.processes import ManagedProcess, group_members, live_groups
from polar_mq.lifecycle.stages import Stage
from polar_mq.workers.launcher import STAGE_WORKER_IMPORTS, parse_concurrency, plan_workers
from tests.conftest import REDIS_URL
from tests.reliability.support import wait_until

BROKER = f"{REDIS_URL}/5"


def _worker_argv(prefix: str) -> list[str]:
    settings = Settings(queue_prefix=prefix, pool="p", node_name="n", broker_url=BROKER)
    (plan,) = plan_workers(settings, [Stage.BUILD], parse_concurrency(None), "threads")
    return plan.argv()


@pytest.fixture()
def child_env(tmp_path: Path) -> dict[str, str]:
    prefix = f"fk{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "POLAR_MQ_BROKER_URL": BROKER,
        "POLAR_MQ_QUEUE_PREFIX": prefix,
        "POLAR_MQ_POOL": "p",
        "POLAR_MQ_NODE_NAME": "n",
        "FORKED_TEST_MARK": prefix,
    }
    preload(STAGE_WORKER_IMPORTS)
    return env


def test_a_forked_worker_is_the_celery_worker_exec_would_start(child_env: dict[str, str]) -> None:
    argv = _worker_argv(child_env["POLAR_MQ_QUEUE_PREFIX"])
    worker = ForkedProcess(argv, child_env)
    try:
        # a real Celery worker: it consumes its queue on the broker
        client = redis.Redis.from_url(BROKER)
        queue = argv[argv.index("-Q") + 1]
        wait_until(lambda: client.exists("_kombu.binding." + queue), 60, "its queue bound")
        # as `ps` and the tests' process lookups see it: the Celery command line
        cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert "celery" in cmdline and f"-n {argv[argv.index('-n') + 1]}" in cmdline, cmdline
        assert worker.poll() is None and worker.returncode is None
        with pytest.raises(subprocess.TimeoutExpired):
            worker.wait(timeout=0.2)
        worker.send_signal(signal.SIGTERM)  # Celery's warm shutdown: a clean exit
        assert worker.wait(timeout=60) == 0
        worker.send_signal(signal.SIGTERM)  # gone: a no-op, not an error
    finally:
        worker.kill()


def test_a_killed_forked_worker_reports_the_signal(child_env: dict[str, str]) -> None:
    worker = ForkedProcess(_worker_argv(child_env["POLAR_MQ_QUEUE_PREFIX"]), child_env)
    worker.kill()
    assert worker.wait(timeout=30) == -signal.SIGKILL
    assert worker.poll() == -signal.SIGKILL


def test_a_forked_worker_runs_with_the_environment_it_was_given(
    child_env: dict[str, str], tmp_path: Path
) -> None:
    """Its settings come from the environment passed, not the fork server's: a bad broker URL
    given to the child alone makes Celery's CLI fail, with its exit code."""
    argv = _worker_argv(child_env["POLAR_MQ_QUEUE_PREFIX"])
    bad = {**child_env, "POLAR_MQ_BROKER_URL": "nosuchscheme://x"}
    worker = ForkedProcess(argv, bad)
    code = worker.wait(timeout=60)
    assert code not in (0, None)


def _child_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.fork_child", *args]


def test_only_python_m_children_with_the_servers_import_time_environment_fork() -> None:
    env = dict(os.environ)
    assert can_fork(_child_argv("0"), env)
    assert not can_fork(["/bin/true"], env)
    assert not can_fork([sys.executable, "-c", "pass"], env)
    assert not can_fork(_child_argv("0"), {**env, "PROMETHEUS_MULTIPROC_DIR": "/elsewhere"})
    assert not can_fork(_child_argv("0"), {**env, "PYTHONPATH": "/elsewhere"})
    # a directory this process imports from already (the tests' stacks give the repository)
    assert can_fork(_child_argv("0"), {**env, "PYTHONPATH": str(Path(__file__).parents[2])})


def test_a_forked_service_is_what_exec_would_have_started(tmp_path: Path) -> None:
    """Its own environment and arguments, a process group it leads, output in its log file,
    `python -m`'s `__main__`, its exit code, exit handlers run."""
    env = {**os.environ, "FORK_CHILD_MARK": "m1"}
    proc = ManagedProcess("child", _child_argv("7", "0.2"), env, tmp_path, fork=True).start()
    assert isinstance(proc.proc, ForkedProcess)
    assert proc.proc.wait(timeout=60) == 7
    log = proc.log_path.read_text()
    assert "mark=m1 args=['7', '0.2']" in log
    assert "leader=True name=__main__" in log
    assert "exit handlers ran" in log
    proc.stop()  # its grandchild, left in its group, goes with it
    assert not live_groups([proc.pid])


def test_stopping_a_forked_service_stops_its_group(tmp_path: Path) -> None:
    proc = ManagedProcess("child", _child_argv("0", "60"), dict(os.environ), tmp_path, fork=True)
    proc.start()
    wait_until(lambda: len(group_members(proc.pid)) >= 2, 30, "the child and its grandchild")
    proc.stop(grace_s=10)
    assert not proc.alive() and proc.proc is not None and proc.proc.returncode == -signal.SIGTERM
    assert not live_groups([proc.pid])


def test_a_child_that_cannot_fork_is_execd(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    proc = ManagedProcess("child", _child_argv("3"), env, tmp_path, fork=True).start()
    assert isinstance(proc.proc, subprocess.Popen)
    assert proc.proc.wait(timeout=60) == 3


def test_a_child_given_another_import_path_runs_the_code_found_there(tmp_path: Path) -> None:
    """A benchmark started an older revision's proxy with `PYTHONPATH` set to its tree: forked
    from the fork server, which holds this checkout's modules, it ran this checkout's code and
    measured it twice. Such a child is exec'd, and imports what its path holds."""
    tree = tmp_path / "other_revision"
    (tree / "tests").mkdir(parents=True)
    (tree / "tests" / "__init__.py").write_text("")
    (tree / "tests" / "fork_child.py").write_text("import sys\nprint('other code')\nsys.exit(5)\n")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = ManagedProcess("child", _child_argv("0"), env, tmp_path, fork=True)
    proc.start()
    assert isinstance(proc.proc, subprocess.Popen)
    assert proc.proc.wait(timeout=60) == 5
    assert "other code" in proc.log_path.read_text()


def test_a_started_forked_service_already_leads_its_group(tmp_path: Path) -> None:
    """`start()` returns once the child made its own session, as `Popen` does: a stop signalled
    to the group before that reached nobody and left the child running (a demo stopped while it
    started its first service, under load)."""
    started = [
        ManagedProcess(f"child{i}", _child_argv("0", "60"), dict(os.environ), tmp_path, fork=True)
        for i in range(10)
    ]
    try:
        for proc in started:
            proc.start()
            assert os.getpgid(proc.pid) == proc.pid
            proc.stop(grace_s=10)  # signalled at once: the whole group goes
            assert not live_groups([proc.pid])
    finally:
        for proc in started:
            if proc.proc is not None:
                proc.stop(grace_s=5)
