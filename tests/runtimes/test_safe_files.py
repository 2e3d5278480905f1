"""`safe_files`: the worker reads and writes a sandbox's files without following any link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from polar_mq.runtimes.safe_files import (
    UnsafePath,
    read_file,
    refuse_links,
    relative_parts,
    write_file,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "rt" / "workspace" / "sub").mkdir(parents=True)
    (tmp_path / "rt" / "home").mkdir()
    (tmp_path / "outside.txt").write_text("secret")
    return tmp_path / "rt"


def ws(root: Path) -> Path:
    return root / "workspace"


def test_regular_files_round_trip_and_directories_are_created(root: Path) -> None:
    write_file(root, "a/b/c.bin", ws(root), bytes(range(256)))
    assert read_file(root, "a/b/c.bin", ws(root)) == bytes(range(256))
    write_file(root, str(ws(root) / "a/b/c.bin"), ws(root), b"v2")  # absolute, replaced
    assert (ws(root) / "a/b/c.bin").read_bytes() == b"v2"
    assert sorted(os.listdir(ws(root) / "a/b")) == ["c.bin"]  # no temporary file left
    assert read_file(root, "../home/../workspace/a/b/c.bin", ws(root)) == b"v2"


@pytest.mark.parametrize(
    "target", ["/nonexistent/polar_mq_target", "../../outside.txt", "../home/x", "sub"]
)
def test_a_symlinked_file_is_refused_both_ways(root: Path, target: str) -> None:
    (root / "home" / "x").write_text("1.0")
    (ws(root) / "reward.txt").symlink_to(target)
    with pytest.raises(UnsafePath, match=r"reward\.txt is a symlink"):
        read_file(root, "reward.txt", ws(root))
    with pytest.raises(UnsafePath, match=r"reward\.txt is a symlink"):
        write_file(root, "reward.txt", ws(root), b"")
    with pytest.raises(UnsafePath, match=r"reward\.txt is a symlink"):
        refuse_links(root, "reward.txt", ws(root))
    assert (root / "home" / "x").read_text() == "1.0"
    assert (root.parent / "outside.txt").read_text() == "secret"


@pytest.mark.parametrize("target", ["/etc", "../home", "sub"])
def test_a_symlinked_directory_on_the_way_is_refused(root: Path, target: str) -> None:
    (ws(root) / "tests").symlink_to(target)
    with pytest.raises(UnsafePath, match="tests is a symlink"):
        write_file(root, "tests/test_hidden.py", ws(root), b"def test(): pass\n")
    with pytest.raises(UnsafePath, match="tests is a symlink"):
        read_file(root, "tests/passwd", ws(root))
    with pytest.raises(UnsafePath, match="tests is a symlink"):
        refuse_links(root, "tests/test_hidden.py", ws(root))
    assert not (root / "home" / "test_hidden.py").exists()


def test_a_file_where_a_directory_is_expected_is_refused(root: Path) -> None:
    (ws(root) / "tests").write_text("not a dir")
    with pytest.raises(UnsafePath, match="not a directory"):
        write_file(root, "tests/t.py", ws(root), b"")


def test_special_files_and_directories_are_not_read(root: Path) -> None:
    os.mkfifo(ws(root) / "fifo")
    with pytest.raises(UnsafePath, match="not a regular file"):
        read_file(root, "fifo", ws(root))  # returns at once: never blocks on the FIFO
    with pytest.raises(UnsafePath, match="a directory"):
        read_file(root, "sub", ws(root))


@pytest.mark.parametrize("bad", ["../../outside.txt", "/etc/passwd", "..", "a\x00b", "/"])
def test_paths_outside_the_root_are_refused(root: Path, bad: str) -> None:
    with pytest.raises(UnsafePath, match="outside runtime rt"):
        relative_parts(root, bad, ws(root))


def test_missing_files_are_missing_not_unsafe(root: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_file(root, "nope/x", ws(root))
    refuse_links(root, "nope/x", ws(root))  # nothing planted: nothing to refuse
