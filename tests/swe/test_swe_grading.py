"""The agent's diff as the grader takes it: against the recorded base (a commit and a moved ref
hide nothing), from a pristine checkout's objects when the agent broke its `.git`, and saved on
the node so a redelivered evaluate grades the same diff after the agent's runtime is gone."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from polar_mq.swe import grading
from polar_mq.swe.checkout import BASE_REF, checkout_repo
from polar_mq.swe.spec import RepoSpec, parse_repo
from tests.swe.test_swe_checkout import git


@pytest.fixture()
def work(tmp_path: Path) -> tuple[Path, RepoSpec, str]:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.py").write_text("A = 1\n")
    workdir = tmp_path / "workspace"
    workdir.mkdir()
    spec = parse_repo({"path": str(plain)})
    done = checkout_repo(spec, workdir)
    return workdir, spec, done.commit


def test_a_commit_and_a_moved_base_ref_still_show(work: tuple[Path, RepoSpec, str]) -> None:
    workdir, spec, base = work
    (workdir / "conftest.py").write_text("# planted\n")
    (workdir / "task.json").write_text("{}")
    (workdir / ".polar" / "mini").mkdir(parents=True)
    (workdir / ".polar" / "mini" / "traj.json").write_text("{}")
    git(workdir, "add", "conftest.py")
    git(workdir, "commit", "-qm", "hide it")
    git(workdir, "update-ref", BASE_REF, "HEAD")
    diff = grading.take_diff(workdir, spec, base, 60)
    assert diff.files == ["conftest.py"]
    assert b"+# planted" in diff.patch


def test_a_removed_git_dir_diffs_against_a_pristine_checkout(
    work: tuple[Path, RepoSpec, str],
) -> None:
    workdir, spec, base = work
    shutil.rmtree(workdir / ".git")
    (workdir / "a.py").write_text("A = 2\n")
    diff = grading.take_diff(workdir, spec, base, 60)
    assert diff.files == ["a.py"] and b"+A = 2" in diff.patch


def test_no_workspace_and_nothing_saved_is_the_platforms_failure(
    tmp_path: Path, work: tuple[Path, RepoSpec, str]
) -> None:
    _, spec, base = work
    with pytest.raises(grading.DiffUnavailable):
        grading.take_diff(tmp_path / "gone", spec, base, 60)


def test_saved_diffs_come_back_whole_and_are_forgotten(tmp_path: Path) -> None:
    root = tmp_path / "runtimes"
    diff = grading.AgentDiff("b" * 40, b"diff --git a/x b/x\n\x00\xff", ["x", "odd name \u00e9"])
    assert grading.load_saved(root, "r-1-eval", diff.base) is None
    grading.save(root, "r-1-eval", diff)
    assert grading.load_saved(root, "r-1-eval", diff.base) == diff
    assert (root / grading.GRADING_DIR).stat().st_mode & 0o777 == 0o700
    assert grading.forget(root, "r-1-eval") is True
    assert grading.forget(root, "r-1-eval") is False
    assert grading.load_saved(root, "r-1-eval", diff.base) is None
