"""The workspace-diff script: new files show in a repository with or without a first commit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from polar_mq.rollouts.artifacts import diff_command


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.mark.parametrize("committed", [False, True])
def test_diff_has_new_files_and_leaves_polar_files_out(tmp_path: Path, committed: bool) -> None:
    _git(tmp_path, "init", "-q")
    if committed:
        (tmp_path / "old.txt").write_text("old\n")
        _git(tmp_path, "add", "old.txt")
        _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    (tmp_path / "result.txt").write_text("forty-two\n")
    (tmp_path / "task.json").write_text("{}")
    (tmp_path / ".polar").mkdir()
    (tmp_path / ".polar" / "config.json").write_text("{}")
    subprocess.run(["/bin/sh", "-c", diff_command()], cwd=tmp_path, check=True)
    diff = (tmp_path / ".polar" / "workspace.diff").read_text()
    assert "+++ b/result.txt" in diff and "+forty-two" in diff
    assert "task.json" not in diff and "config.json" not in diff and "old.txt" not in diff
