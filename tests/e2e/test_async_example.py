"""`examples/async_grpo_loop.py --local`: the worked example runs to completion on its own stack."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "async_grpo_loop.py"


def test_async_grpo_example_local(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_MQ_")}
    argv = [
        sys.executable, str(EXAMPLE), "--local", "--tasks", "6", "--samples", "2",
        "--batch-size", "2", "--max-staleness", "1", "--step-s", "0.2", "--load-s", "0.05",
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    steps = re.findall(r"^step +\d+ v(\d+)->v(\d+): (\d+) groups", done.stdout, re.M)
    assert steps, out
    assert all(int(b) == int(a) + 1 for a, b, _ in steps), out  # one version per step
    found = re.search(r"withheld or dropped as stale[^:]*: (\d+)", done.stdout)
    assert found, out
    withheld = int(found.group(1))
    assert sum(int(n) for *_, n in steps) + withheld == 6, out
    lags = [int(lag) for lag in re.findall(r"^ +(\d+) \|", done.stdout, re.M)]
    assert lags and max(lags) <= 1, out  # never staler than max_staleness
