"""`polar-mq demo --fake`: the embedded defaults (SQLite database, SQLite broker) end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
