"""The workspace diff is skipped (no process spawned) only where git could find no repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

from polar_mq.rollouts.artifacts import may_be_work_tree, workspace_diff
from polar_mq.runtimes.local import LocalRuntime
from tests.conftest import runtime_id


def test_a_plain_workspace_is_no_work_tree_and_spawns_nothing(tmp_path: Path) -> None:
    runtime = LocalRuntime(runtime_id("r1"), tmp_path / "root")
    runtime.start()
    try:
        assert not may_be_work_tree(runtime.workdir)
        calls: list[str] = []
        runtime.exec = lambda *a, **k: calls.append("exec")  # type: ignore[method-assign]
        assert workspace_diff(runtime) is None
        assert calls == []
    finally:
        runtime.stop()


def test_a_repository_in_the_workspace_or_above_it_is_diffed(tmp_path: Path) -> None:
    runtime = LocalRuntime(runtime_id("r2"), tmp_path / "root")
    runtime.start()
    try:
        work = runtime.workdir
        (work / "new.txt").write_text("hello\n")
        subprocess.run(["git", "init", "-q", str(work)], check=True)
        assert may_be_work_tree(work)
        diff = workspace_diff(runtime)
        assert diff is not None and b"new.txt" in diff
        nested = work / "sub"
        nested.mkdir()
        assert may_be_work_tree(nested)  # git finds the repository of a parent too
        (work / ".git").rename(work / "moved")
        (work / ".git").symlink_to(work / "moved")  # a link counts: git may follow it
        assert may_be_work_tree(work)
    finally:
        runtime.stop()
