"""The workspace diff: new, changed and deleted files against the base, without touching the
agent's index and without ever running the workspace's own git configuration."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from polar_mq.swe.checkout import BASE_REF, checkout_repo
from polar_mq.swe.diff import base_commit, workspace_diff
from polar_mq.swe.spec import parse_repo
from tests.swe.test_swe_checkout import git


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.py").write_text("A = 1\n")
    (plain / "gone.py").write_text("G = 1\n")
    workdir = tmp_path / "workspace"
    workdir.mkdir()
    (workdir / "task.json").write_text("{}")
    checkout_repo(parse_repo({"path": str(plain)}), workdir)
    return workdir


def test_changes_new_and_deleted_files_but_not_polar_mq_files(work: Path) -> None:
    (work / "a.py").write_text("A = 2\n")
    (work / "gone.py").unlink()
    (work / "new.py").write_text("N = 1\n")
    (work / "answer.txt").write_text("done")
    diff = workspace_diff(work)
    assert diff.error is None and diff.files == ["a.py", "gone.py", "new.py"]
    assert diff.text is not None and "+A = 2" in diff.text and "new file mode" in diff.text
    assert "task.json" not in diff.text and "answer.txt" not in diff.text
    assert not diff.truncated


def test_the_agents_index_and_commits_do_not_change_the_diff(work: Path) -> None:
    (work / "a.py").write_text("A = 3\n")
    git(work, "add", "a.py")
    staged = git(work, "diff", "--cached", "--name-only")
    (work / "b.py").write_text("B = 1\n")
    git(work, "add", "b.py")
    git(work, "commit", "-qm", "agent commit")  # moves HEAD, not the base
    (work / "c.py").write_text("C = 1\n")
    git(work, "add", "c.py")
    before = git(work, "diff", "--cached", "--name-only")
    diff = workspace_diff(work)
    assert diff.files == ["a.py", "b.py", "c.py"]
    assert git(work, "diff", "--cached", "--name-only") == before == "c.py" != staged


def test_the_workspaces_filter_and_diff_drivers_never_run(work: Path, tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    with (work / ".git" / "config").open("a") as config:
        config.write(
            f'[filter "x"]\n\tclean = touch {pwned}\n[diff "x"]\n\ttextconv = touch {pwned}\n'
        )
        config.write(f"[core]\n\tfsmonitor = touch {pwned}\n")
    (work / ".gitattributes").write_text("* filter=x diff=x\n")
    (work / "a.py").write_text("A = 4\n")
    diff = workspace_diff(work)
    assert diff.error is None and "+A = 4" in (diff.text or "")
    assert not pwned.exists()


def test_truncation_and_errors(work: Path, tmp_path: Path) -> None:
    (work / "big.txt").write_text("x\n" * 10_000)
    diff = workspace_diff(work, max_chars=500)
    assert diff.truncated and diff.text is not None and len(diff.text) == 500
    assert diff.detail()["diff_files"] == ["big.txt"]
    plain = tmp_path / "no_repo"
    plain.mkdir()
    assert workspace_diff(plain).detail() == {"diff_error": "the workspace is not a git repository"}
    (work / ".git" / "refs" / "polar_mq" / "base").unlink()
    assert "no refs/polar_mq/base" in (workspace_diff(work).error or "")


@pytest.mark.parametrize("swap", ["fifo", "link"])
def test_a_base_ref_swapped_for_a_fifo_or_link_is_never_read(
    work: Path, tmp_path: Path, swap: str
) -> None:
    """A FIFO would block the worker, a link would read a file of the agent's choosing: both are
    refused, the base ref counts as missing (the diff is off, never hung)."""
    ref = work / ".git" / BASE_REF
    sha = ref.read_text().strip()
    (tmp_path / "mine").write_text(sha)
    ref.unlink()
    (work / ".git" / "packed-refs").unlink(missing_ok=True)
    if swap == "fifo":
        os.mkfifo(ref)
    else:
        ref.symlink_to(tmp_path / "mine")
    assert base_commit(work / ".git") is None
    assert workspace_diff(work).error == f"no {BASE_REF} in the workspace repository"


def test_harness_files_under_polar_are_not_the_agents_changes(work: Path) -> None:
    """mini-swe-agent keeps its config and trajectory in `.polar/mini/`: listed before."""
    (work / ".polar" / "mini").mkdir(parents=True)
    (work / ".polar" / "mini" / "trajectory.json").write_text("{}")
    (work / "a.py").write_text("A = 5\n")
    assert workspace_diff(work).files == ["a.py"]
