"""Harbor-style task folders: loaded as tasks with hidden tests, runnable by the tests evaluator
with Harbor's absolute paths (/tests, /logs/verifier, the WORKDIR) mapped into the workspace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar_mq.evaluators import EvalContext, get_evaluator
from polar_mq.jobs.harbor_tasks import REWARD_FILE, TESTS_DEST, load_harbor_tasks
from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.task_errors import TasksFileError
from polar_mq.jobs.tasks_file import load_job_file
from polar_mq.runtimes import LocalRuntime
from polar_mq.swe.checkout import checkout_repo
from polar_mq.swe.spec import agent_task, parse_repo
from tests.conftest import runtime_id

TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
cd /srv/app
if python3 /tests/check.py; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
CHECK = "import pathlib\nassert pathlib.Path('/srv/app/greeting.txt').read_text().strip() == 'hi'\n"


def make_harbor(root: Path) -> Path:
    task = root / "greet"
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir()
    (task / "instruction.md").write_text("Write hi into greeting.txt.\n")
    (task / "task.toml").write_text(
        'version = "1.0"\n[metadata]\ndifficulty = "easy"\n[verifier]\ntimeout_sec = 30.0\n'
    )
    (task / "tests" / "test.sh").write_text(TEST_SH)
    (task / "tests" / "check.py").write_text(CHECK)
    (task / "environment" / "Dockerfile").write_text("FROM python:3.11\nWORKDIR /srv/app\n")
    (task / "environment" / "greeting.txt").write_text("hello\n")
    bare = root / "bare"  # no environment: no repository
    (bare / "tests").mkdir(parents=True)
    (bare / "instruction.md").write_text("Do nothing.\n")
    (bare / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (root / "notes").mkdir()  # not a task folder: skipped
    return root


def test_folders_become_tasks_with_hidden_tests(tmp_path: Path) -> None:
    bare, greet = load_harbor_tasks(make_harbor(tmp_path / "harbor"))
    assert greet["instruction"] == "Write hi into greeting.txt.\n"
    assert greet["metadata"] == {"harbor_task": "greet", "difficulty": "easy"}
    assert greet["repo"]["path"] == str((tmp_path / "harbor" / "greet" / "environment").resolve())
    tests = greet["tests"]
    assert tests["dest"] == TESTS_DEST and tests["reward_file"] == REWARD_FILE
    assert tests["timeout"] == 30.0 and tests["paths"]["/srv/app"] == "{workspace}"
    assert "repo" not in bare and "/app" in bare["tests"]["paths"]
    assert "tests" not in agent_task(greet, None)
    job = JobCreate.model_validate({"tasks": [bare, greet], "evaluator": "tests"})
    assert len(job.tasks) == 2


def test_a_directory_or_a_tasks_source_in_a_job_file(tmp_path: Path) -> None:
    make_harbor(tmp_path / "harbor")
    assert len(load_job_file(tmp_path / "harbor").tasks) == 2
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps({"tasks_source": {"harbor": "harbor"}, "samples_per_task": 2}))
    loaded = load_job_file(job_file)
    assert len(loaded.tasks) == 2 and loaded.job == {"samples_per_task": 2}
    yaml_file = tmp_path / "job.yaml"
    yaml_file.write_text("tasks_source:\n  harbor: harbor/greet\n")
    assert [t["metadata"]["harbor_task"] for t in load_job_file(yaml_file).tasks] == ["greet"]


def test_relative_repo_and_tests_paths_resolve_against_the_job_file(tmp_path: Path) -> None:
    job_file = tmp_path / "sub" / "job.json"
    job_file.parent.mkdir()
    task = {"instruction": "x", "repo": {"path": "repos/a"}, "tests": {"path": "/abs/t"}}
    job_file.write_text(json.dumps({"tasks": [task]}))
    (loaded,) = load_job_file(job_file).tasks
    assert loaded["repo"] == {"path": str(tmp_path / "sub" / "repos" / "a")}
    assert loaded["tests"] == {"path": "/abs/t"}


def test_bad_folders_are_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(TasksFileError, match="no Harbor task folders"):
        load_harbor_tasks(tmp_path / "empty")
    (tmp_path / "broken" / "t").mkdir(parents=True)
    (tmp_path / "broken" / "t" / "instruction.md").write_text("x")
    with pytest.raises(TasksFileError, match=r"needs tests/test\.sh"):
        load_harbor_tasks(tmp_path / "broken")
    bad = tmp_path / "job.json"
    bad.write_text(json.dumps({"tasks_source": {"hf": "x"}}))
    with pytest.raises(TasksFileError, match="tasks_source must be"):
        load_job_file(bad)


def test_the_verifier_runs_in_the_workspace_and_its_reward_counts(tmp_path: Path) -> None:
    _, greet = load_harbor_tasks(make_harbor(tmp_path / "harbor"))
    runtime = LocalRuntime(runtime_id("harbor-1"), tmp_path / "runtimes")
    runtime.start()
    try:
        checkout_repo(parse_repo(greet["repo"]), runtime.workdir)
        assert not (runtime.workdir / "Dockerfile").exists()
        ctx = EvalContext("r", greet, runtime, runtime.workdir, 0, "completed", None)
        # in place: the evaluate stage is not here to take the diff and build a pristine runtime
        evaluator = get_evaluator({"name": "tests", "mode": "in_place"})
        assert evaluator.evaluate(ctx).reward == 0.0
        (runtime.workdir / "greeting.txt").write_text("hi\n")
        result = evaluator.evaluate(ctx)
        assert result.reward == 1.0, result.detail
        assert result.detail["diff_files"] == ["greeting.txt"]
        script = (runtime.workdir / TESTS_DEST / "test.sh").read_text()
        assert f"cd {runtime.workdir}\n" in script
        assert f"{runtime.workdir}/.harbor/logs/verifier/reward.txt" in script
    finally:
        runtime.stop()
