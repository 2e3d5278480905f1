"""`polar-mq demo --fake`: the embedded defaults (SQLite database, SQLite broker) end to end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e


def _run_demo(tmp_path: Path, timeout: float) -> tuple[int, str, str]:
    """Run the demo in its own process group; on timeout stop it with SIGTERM (it stops its
    stack), then kill whatever of the group is left, and fail with its services' last log lines
    (a timed-out demo killed alone left its whole stack running for the rest of the suite)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_MQ_")}
    demo = subprocess.Popen(
        [sys.executable, "-m", "polar_mq.cli", "demo", "--fake", "--tasks", "2", "--samples", "2"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = demo.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        demo.send_signal(signal.SIGTERM)
        try:
            out, err = demo.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(demo.pid, signal.SIGKILL)
        logs = sorted((tmp_path / ".polar_mq/demo/logs").glob("*.log"))
        tails = "\n".join(f"== {p.name}\n" + "\n".join(p.read_text().splitlines()[-5:])
                          for p in logs)  # fmt: skip
        pytest.fail(f"the demo did not finish in {timeout} s:\n{out}\n{err}\n{tails}")
    return demo.returncode, out, err


def test_demo_on_embedded_defaults(tmp_path: Path) -> None:
    returncode, out, err = _run_demo(tmp_path, timeout=240)
    assert returncode == 0, out + err
    assert "4 rollouts" in out
    assert out.count("│ 1 1") == 2, out  # both groups: two samples, reward 1 each
    assert (tmp_path / ".polar_mq/demo/polar_mq.db").exists()


def test_demo_stopped_with_sigterm_leaves_no_process(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_MQ_")}
    demo = subprocess.Popen(
        [sys.executable, "-m", "polar_mq.cli", "demo", "--fake", "--tasks", "2", "--samples", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert demo.stdout is not None
    for line in demo.stdout:
        if "starting proxy" in line:
            break
    time.sleep(3)  # the stack's processes are up or starting
    children = psutil.Process(demo.pid).children(recursive=True)
    assert children
    demo.send_signal(signal.SIGTERM)
    demo.wait(timeout=60)
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [p.cmdline() for p in alive]
