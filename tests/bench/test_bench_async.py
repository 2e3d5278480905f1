"""Smoke run of `python -m bench.async --quick`: the real stack, every configuration, a table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.benchmark]
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_bench_async_quick(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.async", "--quick", "--results-dir", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "WARNING" not in out, out
    for row in ("(a) synchronous", "(b) async, staleness 1", "(c) async, staleness 2"):
        assert row in out, out
    [result] = tmp_path.glob("async-*.json")
    runs = json.loads(result.read_text())["runs"]
    assert [r["max_staleness"] for r in runs] == [None, 1, 2]
    for run in runs:
        # every group consumed once, every sample usable, never staler than its bound
        assert run["groups"] + run["withheld_groups"] == 6, run
        assert run["usable_samples"] == run["samples"], run
        bound = run["max_staleness"] or 0
        assert all(int(lag) <= bound for lag in run["staleness"]), run
    assert runs[0]["staleness"] == {"0": runs[0]["groups"]}
