"""The task fields `repo` and `tests`: accepted shapes, refused ones, the agent's view."""

from __future__ import annotations

from typing import Any

import pytest

from polar_mq.swe.spec import TaskSpecError, agent_task, parse_repo, parse_tests


def test_repo_sources_and_commit() -> None:
    spec = parse_repo({"bundle": "/data/r.bundle", "commit": "v1.2"})
    assert (spec.kind, spec.location, spec.commit) == ("bundle", "/data/r.bundle", "v1.2")
    assert parse_repo({"path": "/r", "exclude": ["Dockerfile"]}).exclude == ("Dockerfile",)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("/r", "must be a mapping"),
        ({}, "exactly one of path, bundle, tarball"),
        ({"path": "/a", "tarball": "/b.tgz"}, "exactly one"),
        ({"path": "relative/dir"}, "absolute path"),
        ({"path": "/r", "commit": "--upload-pack=evil"}, "sha, branch or tag"),
        ({"path": "/r", "commit": "a..b"}, "sha, branch or tag"),
        ({"path": "/r", "branch": "x"}, "unknown field"),
        ({"path": "/r", "exclude": ["a/b"]}, "top-level names"),
    ],
)
def test_bad_repo_specs(raw: Any, message: str) -> None:
    with pytest.raises(TaskSpecError, match=message):
        parse_repo(raw)


def test_tests_sources_and_options() -> None:
    spec = parse_tests({"files": {"tests/test_a.py": "x"}, "names": ["tests/test_a.py::t"]})
    assert spec.files == {"tests/test_a.py": "x"} and spec.names == ("tests/test_a.py::t",)
    spec = parse_tests({"path": "/h", "dest": "hidden", "timeout": 5, "reward_file": "r.txt"})
    assert (spec.path, spec.dest, spec.timeout, spec.reward_file) == ("/h", "hidden", 5.0, "r.txt")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"files": {"../escape.py": "x"}}, "inside the workspace"),
        ({"files": {"/abs.py": "x"}}, "inside the workspace"),
        ({"files": {".git/hooks/pre-commit": "x"}}, ".git"),
        ({"files": {"a.py": 1}}, "must be a string"),
        ({"files": {}}, "map 1-"),
        ({"path": "/h", "dest": "."}, "below the workspace root"),
        ({"path": "/h", "names": []}, "non-empty list"),
        ({"path": "/h", "timeout": 0}, "positive number"),
        ({"path": "/h", "paths": {"tests": "x"}}, "absolute paths"),
        ({"path": "/h", "secret": 1}, "unknown field"),
    ],
)
def test_bad_tests_specs(raw: Any, message: str) -> None:
    with pytest.raises(TaskSpecError, match=message):
        parse_tests(raw)


def test_the_agent_never_sees_hidden_tests_or_node_paths() -> None:
    task = {"instruction": "fix", "repo": {"path": "/r"}, "tests": {"path": "/h"}, "k": 1}
    assert agent_task(task, "abc") == {"instruction": "fix", "k": 1, "repo": {"commit": "abc"}}
    assert agent_task({"instruction": "x", "tests": {"path": "/h"}}, None) == {"instruction": "x"}


def test_protected_patterns_add_to_the_default_and_bad_ones_are_refused() -> None:
    spec = parse_tests({"files": {"tests/t.py": ""}, "protected": ["/docs/conf.py", "*.cfg"]})
    assert spec.protected == ("/docs/conf.py", "*.cfg")
    for bad in ("*.cfg", ["../x"], ["/"], [1], ["ok"] * 201):
        with pytest.raises(TaskSpecError, match="path patterns"):
            parse_tests({"files": {"tests/t.py": ""}, "protected": bad})
