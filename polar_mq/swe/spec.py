"""The task fields `repo` and `tests`, checked at submission so a bad one is a 4xx.

`repo`: where the task's repository comes from, one of
  {"path": DIR}        a git repository, or a plain directory (imported as one commit)
  {"bundle": FILE}     a git bundle
  {"tarball": FILE}    a .tar / .tar.gz / .tgz of a repository or a plain tree
plus optional "commit" (a sha, branch or tag; default the source's HEAD) and "exclude" (top-level
names left out when a plain tree is imported, e.g. a Dockerfile).

`tests`: the hidden tests, one of
  {"path": DIR}                  copied to `dest` (default "tests") in the grading workspace
  {"files": {RELPATH: TEXT}}     written at those workspace paths
plus optional "names" (the named tests that score), "command", "reward_file", "timeout",
"paths" (absolute paths in the test files to rewrite into the workspace; see harbor_tasks.py) and
"protected" (path patterns whose changes the grader drops, on top of `swe.protect`'s default).

Paths are node paths: the workers read them, so they must be absolute (the CLI resolves a
relative path against the job file's directory before submitting). Workspace paths must stay
inside the workspace. Nothing here touches the file system: a path that is missing on the node is
found by the stage that reads it, which fails the rollout with a clear reason.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

REPO_SOURCES = ("path", "bundle", "tarball")
TEST_SOURCES = ("path", "files")
_REPO_KEYS = {*REPO_SOURCES, "commit", "exclude"}
_TESTS_KEYS = {
    *TEST_SOURCES,
    "dest",
    "names",
    "command",
    "reward_file",
    "timeout",
    "paths",
    "protected",
}
MAX_PROTECTED = 200
# A sha, branch or tag name; never an option (a leading "-") and never a range or path escape.
_COMMIT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/@^~{}+-]{0,199}")
MAX_TEST_FILES = 1000
MAX_NAMES = 10_000


class TaskSpecError(ValueError):
    """A task's `repo` or `tests` field is malformed (the API answers 422)."""


@dataclass(frozen=True, slots=True)
class RepoSpec:
    """Where a task's repository comes from and which commit to check out."""

    kind: str
    location: str
    commit: str | None = None
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TestsSpec:
    """A task's hidden tests and how the `tests` evaluator should run them."""

    path: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    dest: str = "tests"
    names: tuple[str, ...] | None = None
    command: str | None = None
    reward_file: str | None = None
    timeout: float | None = None
    paths: dict[str, str] = field(default_factory=dict)
    protected: tuple[str, ...] = ()


def workspace_path(value: Any, where: str) -> str:
    """A relative path that stays inside the workspace and out of its `.git`."""
    if not isinstance(value, str) or not value.strip():
        raise TaskSpecError(f"{where} must be a non-empty relative path")
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or "\\" in value or "\x00" in value:
        raise TaskSpecError(f"{where} {value!r} must be relative and stay inside the workspace")
    if path.parts and path.parts[0] == ".git":
        raise TaskSpecError(f"{where} {value!r} may not point into the repository's .git")
    return str(path)


def _node_path(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value:
        raise TaskSpecError(
            f"{where} must be an absolute path on the worker nodes (the CLI resolves relative "
            "paths against the job file)"
        )
    return value


def _one_source(raw: Mapping[str, Any], sources: tuple[str, ...], where: str) -> str:
    given = [key for key in sources if key in raw]
    if len(given) != 1:
        raise TaskSpecError(f"{where} needs exactly one of {', '.join(sources)}")
    return given[0]


def parse_repo(raw: Any, where: str = "repo") -> RepoSpec:
    """The task's `repo` field as a RepoSpec, or TaskSpecError saying what is wrong."""
    if not isinstance(raw, Mapping):
        raise TaskSpecError(f"{where} must be a mapping")
    unknown = sorted(set(raw) - _REPO_KEYS)
    if unknown:
        raise TaskSpecError(f"{where}: unknown field(s) {', '.join(unknown)}")
    kind = _one_source(raw, REPO_SOURCES, where)
    location = _node_path(raw[kind], f"{where}.{kind}")
    commit = raw.get("commit")
    if commit is not None and (
        not isinstance(commit, str) or not _COMMIT.fullmatch(commit) or ".." in commit
    ):
        raise TaskSpecError(f"{where}.commit must be a sha, branch or tag name, got {commit!r}")
    exclude = raw.get("exclude", [])
    if not isinstance(exclude, list) or not all(
        isinstance(n, str) and n and "/" not in n and n not in (".", "..") for n in exclude
    ):
        raise TaskSpecError(f"{where}.exclude must be a list of top-level names")
    return RepoSpec(kind, location, commit, tuple(exclude))


def parse_tests(raw: Any, where: str = "tests") -> TestsSpec:
    """The task's `tests` field as a TestsSpec, or TaskSpecError saying what is wrong."""
    if not isinstance(raw, Mapping):
        raise TaskSpecError(f"{where} must be a mapping")
    unknown = sorted(set(raw) - _TESTS_KEYS)
    if unknown:
        raise TaskSpecError(f"{where}: unknown field(s) {', '.join(unknown)}")
    kind = _one_source(raw, TEST_SOURCES, where)
    path = _node_path(raw["path"], f"{where}.path") if kind == "path" else None
    files: dict[str, str] = {}
    if kind == "files":
        given = raw["files"]
        if not isinstance(given, Mapping) or not given or len(given) > MAX_TEST_FILES:
            raise TaskSpecError(f"{where}.files must map 1-{MAX_TEST_FILES} paths to text")
        for name, text in given.items():
            if not isinstance(text, str):
                raise TaskSpecError(f"{where}.files[{name!r}] must be a string")
            files[workspace_path(name, f"{where}.files key")] = text
    dest = workspace_path(raw.get("dest", "tests"), f"{where}.dest")
    if path is not None and dest == ".":
        raise TaskSpecError(f"{where}.dest must name a directory below the workspace root")
    return TestsSpec(
        path=path,
        files=files,
        dest=dest,
        names=check_names(raw.get("names"), f"{where}.names"),
        command=check_text(raw.get("command"), f"{where}.command"),
        reward_file=(
            None
            if raw.get("reward_file") is None
            else workspace_path(raw["reward_file"], f"{where}.reward_file")
        ),
        timeout=check_timeout(raw.get("timeout"), f"{where}.timeout"),
        paths=_path_map(raw.get("paths"), f"{where}.paths"),
        protected=check_patterns(raw.get("protected"), f"{where}.protected"),
    )


def check_patterns(value: Any, where: str) -> tuple[str, ...]:
    """Protected-path patterns (see `polar_mq.swe.protect`): added to the default, never less."""
    if value is None:
        return ()
    if (
        not isinstance(value, list)
        or len(value) > MAX_PROTECTED
        or not all(
            isinstance(p, str) and p.strip("/") and "\x00" not in p and ".." not in p.split("/")
            for p in value
        )
    ):
        raise TaskSpecError(
            f"{where} must be a list of at most {MAX_PROTECTED} path patterns, e.g. "
            '["/docs/conf.py", "*.cfg"]'
        )
    return tuple(value)


def check_names(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not value
        or len(value) > MAX_NAMES
        or not all(isinstance(n, str) and n.strip() for n in value)
    ):
        raise TaskSpecError(f"{where} must be a non-empty list of test names")
    return tuple(value)


def check_text(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise TaskSpecError(f"{where} must be a non-empty string")
    return value


def check_timeout(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise TaskSpecError(f"{where} must be a positive number of seconds")
    return float(value)


def _path_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and k.startswith("/") and len(k) > 1 and isinstance(v, str)
        for k, v in value.items()
    ):
        raise TaskSpecError(f"{where} must map absolute paths to replacement strings")
    return dict(value)


def validate_task_fields(task: Mapping[str, Any]) -> None:
    """Check a task's `repo` and `tests` fields when present (TaskSpecError says what is wrong)."""
    if "repo" in task:
        parse_repo(task["repo"])
    if "tests" in task:
        parse_tests(task["tests"])


def agent_task(task: Mapping[str, Any], commit: str | None) -> dict[str, Any]:
    """The task as the agent's task file shows it: no hidden tests, no node paths.

    The repository is already in the workspace; the agent learns only the commit it starts from.
    """
    shown = {key: value for key, value in task.items() if key not in ("tests", "repo")}
    if commit is not None:
        shown["repo"] = {"commit": commit}
    return shown
