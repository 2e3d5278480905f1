"""Checking a task's repository out into a workspace, from each kind of source, with real git."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from polar_mq.swe.checkout import BASE_REF, CheckoutError, checkout_repo
from polar_mq.swe.spec import parse_repo


def git(cwd: Path, *args: str) -> str:
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin"}
    ident = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=trunk"]
    done = subprocess.run(
        ["git", *ident, *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture()
def history(tmp_path: Path) -> tuple[Path, str, str]:
    """A source repository with a buggy commit (tagged v1) and a later commit holding the fix."""
    src = tmp_path / "src"
    src.mkdir()
    git(src, "init", "-q")
    (src / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git(src, "add", "-A")
    git(src, "commit", "-qm", "buggy")
    git(src, "tag", "v1")
    buggy = git(src, "rev-parse", "HEAD")
    (src / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    git(src, "commit", "-qam", "the fix")
    return src, buggy, git(src, "rev-parse", "HEAD")


def workspace(tmp_path: Path) -> Path:
    work = tmp_path / "workspace"
    work.mkdir(parents=True, exist_ok=True)
    (work / "task.json").write_text("{}")  # written before the checkout by the warm pool path
    return work


@pytest.mark.parametrize("commit", ["v1", "sha"])
def test_a_git_path_at_a_commit_without_later_history(
    tmp_path: Path, history: tuple[Path, str, str], commit: str
) -> None:
    src, buggy, fix = history
    work = workspace(tmp_path)
    wanted = buggy if commit == "sha" else commit
    done = checkout_repo(parse_repo({"path": str(src), "commit": wanted}), work)
    assert done.commit == buggy
    assert "a - b" in (work / "calc.py").read_text()
    assert git(work, "rev-parse", "HEAD") == git(work, "rev-parse", BASE_REF) == buggy
    assert git(work, "branch", "--show-current") == "main"
    assert git(work, "status", "--porcelain") == "", "task.json is excluded, the tree is clean"
    assert git(work, "remote") == "" and not (work / ".git" / "FETCH_HEAD").exists()
    with pytest.raises(subprocess.CalledProcessError):
        git(work, "cat-file", "-e", fix)  # the fix commit never reached the workspace
    assert str(src) not in (work / ".git" / "config").read_text()


def test_default_commit_is_head(tmp_path: Path, history: tuple[Path, str, str]) -> None:
    src, _, fix = history
    assert checkout_repo(parse_repo({"path": str(src)}), workspace(tmp_path)).commit == fix


def test_a_plain_directory_is_imported_as_one_reproducible_commit(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    (plain / "pkg").mkdir(parents=True)
    (plain / "pkg" / "__init__.py").write_text("X = 1\n")
    (plain / "Dockerfile").write_text("FROM scratch\n")
    spec = parse_repo({"path": str(plain), "exclude": ["Dockerfile"]})
    first = checkout_repo(spec, workspace(tmp_path / "a"))
    second = checkout_repo(spec, workspace(tmp_path / "b"))
    assert first.commit == second.commit, "same tree, same sha on every node"
    work = tmp_path / "b" / "workspace"
    assert (work / "pkg" / "__init__.py").read_text() == "X = 1\n"
    assert not (work / "Dockerfile").exists()
    assert not (plain / ".git").exists(), "the source is only read"


def test_a_bundle_and_tarballs(tmp_path: Path, history: tuple[Path, str, str]) -> None:
    src, buggy, _ = history
    bundle = tmp_path / "repo.bundle"
    git(src, "bundle", "create", str(bundle), "--all")
    done = checkout_repo(parse_repo({"bundle": str(bundle), "commit": "v1"}), workspace(tmp_path))
    assert done.commit == buggy
    with_git = tmp_path / "with_git.tar.gz"
    with tarfile.open(with_git, "w:gz") as archive:
        archive.add(src, arcname="project")
    spec = parse_repo({"tarball": str(with_git), "commit": buggy})
    assert checkout_repo(spec, workspace(tmp_path / "t1")).commit == buggy
    plain = tmp_path / "plain.tar"
    with tarfile.open(plain, "w") as archive:
        archive.add(src / "calc.py", arcname="calc.py")
    checkout_repo(parse_repo({"tarball": str(plain)}), workspace(tmp_path / "t2"))
    assert "a + b" in (tmp_path / "t2" / "workspace" / "calc.py").read_text()


def test_failures_say_what_is_wrong(tmp_path: Path, history: tuple[Path, str, str]) -> None:
    src, _, _ = history
    with pytest.raises(CheckoutError, match="is not a directory on this node"):
        checkout_repo(parse_repo({"path": str(tmp_path / "missing")}), workspace(tmp_path))
    with pytest.raises(CheckoutError, match="is not a file on this node"):
        spec = parse_repo({"bundle": str(tmp_path / "x.bundle")})
        checkout_repo(spec, workspace(tmp_path / "b"))
    with pytest.raises(CheckoutError, match="'nope' is not in the repository"):
        spec = parse_repo({"path": str(src), "commit": "nope"})
        checkout_repo(spec, workspace(tmp_path / "c"))
    broken = tmp_path / "broken.tgz"
    broken.write_bytes(b"not a tarball")
    with pytest.raises(CheckoutError, match="cannot extract"):
        checkout_repo(parse_repo({"tarball": str(broken)}), workspace(tmp_path / "d"))
    checkout_repo(parse_repo({"path": str(src)}), workspace(tmp_path / "e"))
    with pytest.raises(CheckoutError, match=r"already holds a \.git"):
        checkout_repo(parse_repo({"path": str(src)}), tmp_path / "e" / "workspace")
