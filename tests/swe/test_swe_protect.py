"""What the grader drops from the agent's diff: test configuration, import hooks, the hidden
tests' places and symlinks, while a fix to the source applies to a pristine checkout as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_mq.swe.apply import ApplyError, apply_patch
from polar_mq.swe.checkout import checkout_repo
from polar_mq.swe.diff import diff_against
from polar_mq.swe.protect import (
    DEFAULT_PROTECTED,
    SYMLINK,
    PatchSplitError,
    filter_patch,
    hidden_test_patterns,
    matches,
    split_patch,
)
from polar_mq.swe.spec import parse_repo

BASE_FILES = {"pkg/__init__.py": "X = 1\n", "pkg/core.py": "def f():\n    return 1\n"}


@pytest.mark.parametrize(
    ("path", "pattern", "expected"),
    [
        ("conftest.py", "conftest.py", True),
        ("pkg/sub/conftest.py", "conftest.py", True),
        ("pkg/conftest.py.bak", "conftest.py", False),
        ("x.dist-info/entry_points.txt", "*.dist-info", True),
        ("deep/x.dist-info/entry_points.txt", "*.dist-info", True),
        ("pytest/__main__.py", "/pytest", True),
        ("src/pytest/__main__.py", "/pytest", False),
        ("pytest_helpers.py", "/pytest", False),
        ("tests/test_a.py", "/tests", True),
        ("tests/helpers/util.py", "/tests", True),
        ("other/tests/test_a.py", "/tests", False),
        ("a.pth", "*.pth", True),
    ],
)
def test_patterns_match_like_gitignore(path: str, pattern: str, expected: bool) -> None:
    assert matches(path, pattern) is expected


def test_the_hidden_tests_places_are_anchored_and_never_the_root() -> None:
    assert hidden_test_patterns(["tests/test_a.py"], "tests", False) == [
        "/tests",
        "/tests/test_a.py",
    ]
    assert hidden_test_patterns(["test_top.py"], "tests", False) == ["/test_top.py"]
    assert hidden_test_patterns(["hidden/t.py"], "hidden", True) == ["/hidden", "/hidden/t.py"]


@pytest.fixture()
def checkout(tmp_path: Path) -> tuple[Path, str]:
    plain = tmp_path / "plain"
    for name, text in BASE_FILES.items():
        (plain / name).parent.mkdir(parents=True, exist_ok=True)
        (plain / name).write_text(text)
    work = tmp_path / "work"
    work.mkdir()
    done = checkout_repo(parse_repo({"path": str(plain)}), work)
    return work, done.commit


def pristine(tmp_path: Path, commit: str) -> Path:
    target = tmp_path / "pristine"
    target.mkdir()
    checkout_repo(parse_repo({"path": str(tmp_path / "plain"), "commit": commit}), target)
    return target


def test_a_cheating_diff_keeps_only_the_fix(tmp_path: Path, checkout: tuple[Path, str]) -> None:
    work, base = checkout
    (work / "pkg" / "core.py").write_text("def f():\n    return 2\n")
    (work / "pkg" / "new.py").write_text("Y = 2\n")
    planted = {
        "conftest.py": "conftest.py",
        "pkg/conftest.py": "conftest.py",
        "pytest.ini": "pytest.ini",
        "pyproject.toml": "pyproject.toml",
        "setup.cfg": "setup.cfg",
        "tox.ini": "tox.ini",
        "zz.pth": "*.pth",
        "sitecustomize.py": "sitecustomize.py",
        "cheat-1.0.dist-info/entry_points.txt": "*.dist-info",
        "pytest/__main__.py": "/pytest",
        "tests/__init__.py": "/tests",
        "tests/test_calc.py": "/tests",
    }
    for name in planted:
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text("# planted\n")
    (work / "evil").symlink_to("/etc/passwd")
    patch, files = diff_against(work, base, work / ".git" / "objects")
    patterns = [*DEFAULT_PROTECTED, *hidden_test_patterns(["tests/test_calc.py"], "tests", False)]
    filtered = filter_patch(patch, files, patterns)
    assert filtered.kept == ["pkg/core.py", "pkg/new.py"]
    rules = {d.path: d.rule for d in filtered.dropped}
    assert rules == {**planted, "evil": SYMLINK}
    target = pristine(tmp_path, base)
    apply_patch(target, filtered.patch)
    assert (target / "pkg" / "core.py").read_text() == "def f():\n    return 2\n"
    assert (target / "pkg" / "new.py").read_text() == "Y = 2\n"
    assert not any((target / name).exists() for name in planted)
    assert not (target / "evil").is_symlink()


def test_deleting_and_binary_files_survive_the_split(
    tmp_path: Path, checkout: tuple[Path, str]
) -> None:
    work, base = checkout
    (work / "pkg" / "__init__.py").unlink()
    (work / "pkg" / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (work / "conftest.py").write_text("# planted\n")
    patch, files = diff_against(work, base, work / ".git" / "objects")
    filtered = filter_patch(patch, files, DEFAULT_PROTECTED)
    assert filtered.kept == ["pkg/__init__.py", "pkg/blob.bin"]
    target = pristine(tmp_path, base)
    apply_patch(target, filtered.patch)
    assert not (target / "pkg" / "__init__.py").exists()
    assert (target / "pkg" / "blob.bin").read_bytes() == bytes(range(256)) * 4


def test_a_patch_that_does_not_fit_is_refused_whole(
    tmp_path: Path, checkout: tuple[Path, str]
) -> None:
    work, base = checkout
    (work / "pkg" / "core.py").write_text("def f():\n    return 3\n")
    patch, _ = diff_against(work, base, work / ".git" / "objects")
    target = pristine(tmp_path, base)
    (target / "pkg" / "core.py").write_text("something else\n")
    with pytest.raises(ApplyError):
        apply_patch(target, patch)


def test_sections_must_line_up_with_the_names() -> None:
    section = b"diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"
    assert split_patch(section * 2, ["x", "y"]) == [section, section]
    with pytest.raises(PatchSplitError):
        split_patch(section, ["x", "y"])
    with pytest.raises(PatchSplitError):
        split_patch(b"garbage", ["x"])
