"""The run-agent stage's `workspace.diff` of a repository polar_mq checked out: it was never
stored (`git add` exits 1 when a path its pathspec excludes is also in `.git/info/exclude`, which
the checkout writes), and `.polar/mini/*` of mini-swe-agent was in it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from polar_mq.rollouts.artifacts import diff_command
from polar_mq.swe.checkout import checkout_repo
from polar_mq.swe.spec import parse_repo
from tests.swe.test_swe_checkout import git


def test_a_checked_out_repository_gets_its_diff_without_polar_mq_files(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.py").write_text("A = 1\n")
    work = tmp_path / "work"
    work.mkdir()
    checkout_repo(parse_repo({"path": str(plain)}), work)
    (work / "task.json").write_text("{}")
    (work / "answer.txt").write_text("done")
    (work / ".polar" / "mini").mkdir(parents=True)
    (work / ".polar" / "mini" / "trajectory.json").write_text("{}")
    (work / "a.py").write_text("A = 2\n")
    (work / "b.py").write_text("B = 1\n")
    git(work, "add", "b.py")
    git(work, "commit", "-qm", "agent commit")  # against the base ref: still in the diff
    done = subprocess.run(["sh", "-c", diff_command()], cwd=work, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    diff = (work / ".polar" / "workspace.diff").read_text()
    assert "+A = 2" in diff and "+B = 1" in diff
    assert ".polar/" not in diff and "task.json" not in diff and "answer.txt" not in diff
