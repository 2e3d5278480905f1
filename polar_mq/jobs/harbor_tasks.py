"""Harbor-style task folders as a task source: one folder per task, graded by its own verifier.

A Harbor task folder holds `instruction.md` (what the agent is told), `tests/test.sh` (the
verifier: it writes a reward, a number, to `/logs/verifier/reward.txt`), optionally `task.toml`
(`[verifier] timeout_sec`, `[metadata]`), `environment/` (the task's container build) and
`solution/` (unused here). Harbor runs the verifier in the task's container with the tests at
`/tests` and the agent's work in the image's WORKDIR (usually `/app`).

polar_mq runtimes have no such fixed layout, so each folder becomes a task whose hidden tests are
the folder's `tests/`, written at evaluate time to `.harbor/tests` in the grading workspace, with
`/tests`, `/logs` and the WORKDIR rewritten to workspace paths in those files; the `tests`
evaluator runs `bash .harbor/tests/test.sh` and reads `.harbor/logs/verifier/reward.txt`. Files
of `environment/` other than the container build files become the task's repository (imported as
one commit, so the diff works). Docker images are not built: pick `runtime.image` yourself.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from polar_mq.jobs.task_errors import TasksFileError

TESTS_DEST = ".harbor/tests"
LOGS_DIR = ".harbor/logs"
REWARD_FILE = f"{LOGS_DIR}/verifier/reward.txt"
COMMAND = f"mkdir -p {LOGS_DIR}/verifier {LOGS_DIR}/agent && bash {TESTS_DEST}/test.sh"
BUILD_FILES = ["Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore"]
DEFAULT_WORKDIR = "/app"
_WORKDIR = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.IGNORECASE | re.MULTILINE)


def is_harbor_task(folder: Path) -> bool:
    return (folder / "instruction.md").is_file()


def load_harbor_tasks(root: Path) -> list[dict[str, Any]]:
    """One task per Harbor task folder under `root` (or `root` itself if it is one), by name."""
    if not root.is_dir():
        raise TasksFileError(f"{root}: not a directory of Harbor tasks")
    folders = [root] if is_harbor_task(root) else sorted(p for p in root.iterdir() if p.is_dir())
    tasks = [harbor_task(folder) for folder in folders if is_harbor_task(folder)]
    if not tasks:
        raise TasksFileError(f"{root}: no Harbor task folders (each needs an instruction.md)")
    return tasks


def harbor_task(folder: Path) -> dict[str, Any]:
    """The polar_mq task of one Harbor task folder (absolute paths: workers read them)."""
    folder = folder.resolve()
    if not (folder / "tests" / "test.sh").is_file():
        raise TasksFileError(f"{folder}: a Harbor task needs tests/test.sh")
    instruction = (folder / "instruction.md").read_text(encoding="utf-8")
    if not instruction.strip():
        raise TasksFileError(f"{folder}/instruction.md is empty")
    config = _task_toml(folder)
    environment = folder / "environment"
    tests: dict[str, Any] = {
        "path": str(folder / "tests"),
        "dest": TESTS_DEST,
        "command": COMMAND,
        "reward_file": REWARD_FILE,
        "paths": {
            "/tests": "{workspace}/" + TESTS_DEST,
            "/logs": "{workspace}/" + LOGS_DIR,
            **({_workdir(environment): "{workspace}"} if _workdir(environment) != "/" else {}),
        },
    }
    timeout = config.get("verifier", {}).get("timeout_sec")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        tests["timeout"] = float(timeout)
    metadata = config.get("metadata")
    task: dict[str, Any] = {
        "instruction": instruction,
        "tests": tests,
        "metadata": {
            "harbor_task": str(config.get("task", {}).get("name") or folder.name),
            **(metadata if isinstance(metadata, dict) else {}),
        },
    }
    if environment.is_dir() and any(p.name not in BUILD_FILES for p in environment.iterdir()):
        task["repo"] = {"path": str(environment), "exclude": BUILD_FILES}
    return task


def _task_toml(folder: Path) -> dict[str, Any]:
    path = folder / "task.toml"
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TasksFileError(f"{path}: not valid TOML: {exc}") from exc


def _workdir(environment: Path) -> str:
    """The Dockerfile's last WORKDIR (where Harbor's agent works), default /app."""
    try:
        found = _WORKDIR.findall((environment / "Dockerfile").read_text(errors="replace"))
    except OSError:
        return DEFAULT_WORKDIR
    workdir = found[-1].strip("\"'").rstrip("/") if found else DEFAULT_WORKDIR
    return workdir if workdir.startswith("/") else DEFAULT_WORKDIR
