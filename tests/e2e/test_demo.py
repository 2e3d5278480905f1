"""`polar-mq demo --fake`: the embedded defaults (SQLite database, SQLite broker) end to end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e


def test_demo_on_embedded_defaults(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_MQ_")}
    done = subprocess.run(
        [sys.executable, "-m", "polar_mq.cli", "demo", "--fake", "--tasks", "2", "--samples", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
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
