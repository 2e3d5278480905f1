"""examples/swe: the job files load and validate, their paths exist, every patch applies."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from polar_mq.jobs.schemas import JobCreate
from polar_mq.jobs.tasks_file import load_job_file

SWE = Path(__file__).resolve().parents[2] / "examples" / "swe"


@pytest.mark.parametrize("preset", ["mini_swe_agent", "claude_code"])
def test_job_files_are_valid_jobs_with_resolved_paths(preset: str) -> None:
    loaded = load_job_file(SWE / f"job_{preset}.json")
    assert loaded.job["harness"] == {"type": preset}
    assert len(loaded.tasks) == 5
    for task in loaded.tasks:
        assert Path(task["repo"]["path"]).is_dir() and Path(task["tests"]["path"]).is_dir()
    # the presets live in polar_mq/harnesses (another change): validate the rest of the job
    spec = {**loaded.spec(), "harness": {"type": "command", "command": "true"}}
    assert JobCreate.model_validate(spec).evaluator == {"name": "tests", "score": "fraction"}


@pytest.mark.parametrize("patch", sorted(p.name for p in (SWE / "fixes").glob("*.patch")))
def test_every_patch_applies_to_its_repository(patch: str, tmp_path: Path) -> None:
    name = patch.split(".")[0]
    work = tmp_path / name
    shutil.copytree(SWE / "repos" / name, work)
    subprocess.run(["git", "apply", "--check", str(SWE / "fixes" / patch)], cwd=work, check=True)
