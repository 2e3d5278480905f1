"""Which of the agent's changes the grader refuses: test files, test configuration, import hooks.

Why: in diff mode the grader applies the agent's diff to a pristine copy of the repository and
runs the hidden tests there. A diff may still carry what steers the test run instead of fixing
the code: a `conftest.py` that marks every report passed, `addopts = -p plugin` in a config
file, a `pytest/` package that shadows the runner, a `*.dist-info` with a `pytest11` entry point,
a `.pth` or `sitecustomize.py` that patches the interpreter on start. Such files are dropped from
the diff before it is applied (as the SWE-bench harness resets test files), and the evaluation
records them as tampering. A fix never needs them; a task that does may narrow nothing but may add
patterns (`tests.protected`).

Patterns (gitignore-like, matched component by component with fnmatch):
- a leading `/` anchors the pattern at the repository root, otherwise it matches at any depth;
- a pattern that matches a directory protects everything below it.
Symlinks are refused wherever they are (a link is how a diff reaches outside the repository).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import PurePosixPath

DEFAULT_PROTECTED = (
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    "*.pth",
    "sitecustomize.py",
    "usercustomize.py",
    "*.dist-info",
    "*.egg-info",
    "/pytest",
    "/_pytest",
    "/py",
    "/pluggy",
    "/pytest.py",
    "/_pytest.py",
    "/py.py",
    "/pluggy.py",
)
"""Test configuration and import hooks, refused in every task (documented in docs/swe_tasks.md).

`pyproject.toml`, `setup.cfg` and `tox.ini` are refused whole, not only their test sections: the
simplest rule that an agent cannot word its way around, at the price of fixes that need a new
dependency (rare in SWE tasks, whose environment the task's recipe sets up)."""

SYMLINK = "symlink"
_SYMLINK_MODES = ("new file mode 120000", "new mode 120000", "old mode 120000")


@dataclass(frozen=True, slots=True)
class Dropped:
    """A file of the agent's diff the grader refused, and the pattern (or `symlink`) why."""

    path: str
    rule: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "rule": self.rule}


@dataclass(frozen=True, slots=True)
class FilteredPatch:
    """The patch to apply (maybe empty), the files kept and the files dropped."""

    patch: bytes
    kept: list[str] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)


class PatchSplitError(ValueError):
    """The patch's file sections do not line up with its file names (never expected)."""


def hidden_test_patterns(paths: Iterable[str], dest: str, whole_dest: bool) -> list[str]:
    """The hidden tests' places, anchored: their destination directory (a `path` source), or each
    file and the directory holding it (a `files` source; never the root itself)."""
    patterns: set[str] = set()
    if whole_dest:
        patterns.add(f"/{dest.strip('/')}")
    for path in paths:
        patterns.add(f"/{path}")
        parent = str(PurePosixPath(path).parent)
        if parent != ".":
            patterns.add(f"/{parent}")
    return sorted(patterns)


def matches(path: str, pattern: str) -> bool:
    """Whether `pattern` (see the module docstring) covers the repository path `path`."""
    parts = path.strip("/").split("/")
    anchored = pattern.startswith("/")
    wanted = pattern.strip("/").split("/")
    starts = [0] if anchored else range(len(parts))
    for start in starts:
        window = parts[start : start + len(wanted)]
        if len(window) == len(wanted) and all(
            fnmatchcase(part, want) for part, want in zip(window, wanted, strict=True)
        ):
            return True
    return False


def rule_for(path: str, patterns: Sequence[str]) -> str | None:
    """The first pattern that protects `path`, or None."""
    return next((pattern for pattern in patterns if matches(path, pattern)), None)


def split_patch(patch: bytes, files: Sequence[str]) -> list[bytes]:
    """One section per file of a `git diff --no-renames` patch, in the order of `files` (git
    writes both in the same order). A section starts at a line `diff --git `, which no line
    inside a section can start with (hunk lines start with ` `, `+`, `-`, `\\` or `@`; binary
    lines are base85, which has no space)."""
    if not patch:
        if files:
            raise PatchSplitError(f"an empty patch for {len(files)} file(s)")
        return []
    marker = b"\ndiff --git "
    if not patch.startswith(b"diff --git "):
        raise PatchSplitError("the patch does not start with a file header")
    body = b"\n" + patch
    starts = []
    at = body.find(marker)
    while at != -1:
        starts.append(at + 1)
        at = body.find(marker, at + 1)
    if len(starts) != len(files):
        raise PatchSplitError(f"{len(starts)} file sections for {len(files)} file name(s)")
    ends = [*starts[1:], len(body)]
    return [body[begin:end] for begin, end in zip(starts, ends, strict=True)]


def is_symlink(section: bytes) -> bool:
    """Whether a file section creates a symlink or turns a file into one."""
    head = section.split(b"\n@@", 1)[0].split(b"\nGIT binary patch", 1)[0]
    return any(mode.encode() in head for mode in _SYMLINK_MODES)


def filter_patch(patch: bytes, files: Sequence[str], patterns: Sequence[str]) -> FilteredPatch:
    """Drop the sections of protected files and of symlinks; keep the others as they were."""
    kept: list[bytes] = []
    kept_files: list[str] = []
    dropped: list[Dropped] = []
    for path, section in zip(files, split_patch(patch, files), strict=True):
        rule = SYMLINK if is_symlink(section) else rule_for(path, patterns)
        if rule is None:
            kept.append(section)
            kept_files.append(path)
        else:
            dropped.append(Dropped(path, rule))
    return FilteredPatch(b"".join(kept), kept_files, dropped)
