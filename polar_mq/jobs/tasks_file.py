"""Job and tasks files for `polar-mq submit`: JSON jobs, JSONL tasks, YAML tasks or jobs.

Formats, by file suffix:

- `.json`: a job object (the body of `POST /v1/jobs`) or a list of tasks.
- `.jsonl`: one task object per line (blank lines and lines starting with `#` are skipped).
- `.yaml` / `.yml`: a list of tasks, or a mapping with `tasks:` plus any other job fields
  (`samples_per_task`, `evaluator`, `harness`, ...).
- a directory: Harbor-style task folders (see `harbor_tasks.py`); a JSON or YAML job may name one
  instead of listing tasks: `"tasks_source": {"harbor": "DIR"}`.

Node paths in a task's `repo` and `tests` (`path`, `bundle`, `tarball`) that are relative are
resolved against the file's directory, so a job file and the repositories beside it can move
together; the API itself accepts only absolute paths.

A task needs a non-empty string `instruction`; `answer` (a string, a number, or a list of them:
any one is accepted by `exact_match`) and `metadata` (a mapping) are optional, and any other key is
kept for the evaluator or harness. Every error names the file and the line (JSONL, YAML) or the
item, so a typo in task 4,312 of a big file is found without bisecting it. The rest of the job is
validated by the API, which answers with the failing field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from polar_mq.jobs.harbor_tasks import load_harbor_tasks
from polar_mq.jobs.task_errors import TasksFileError

JSON_SUFFIXES = (".json",)
JSONL_SUFFIXES = (".jsonl", ".ndjson")
YAML_SUFFIXES = (".yaml", ".yml")


@dataclass(slots=True)
class JobFile:
    """What a file holds: its tasks and whatever other job fields it sets."""

    tasks: list[dict[str, Any]]
    job: dict[str, Any] = field(default_factory=dict)
    """Job fields other than `tasks` (empty for a plain list of tasks)."""

    def spec(self) -> dict[str, Any]:
        return {**self.job, "tasks": self.tasks}


def check_task(raw: Any, where: str) -> dict[str, Any]:
    """The task if it is one; else TasksFileError naming `where` and what is wrong."""
    if not isinstance(raw, Mapping):
        raise TasksFileError(f"{where}: a task must be a mapping, got {type(raw).__name__}")
    task = dict(raw)
    instruction = task.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise TasksFileError(f"{where}: 'instruction' must be a non-empty string")
    if "answer" in task and not _is_answer(task["answer"]):
        raise TasksFileError(f"{where}: 'answer' must be a string, a number, or a list of them")
    if "metadata" in task and not isinstance(task["metadata"], Mapping):
        raise TasksFileError(f"{where}: 'metadata' must be a mapping")
    return task


def _is_answer(value: Any) -> bool:
    def scalar(v: Any) -> bool:
        return isinstance(v, str | int | float) and not isinstance(v, bool)

    return scalar(value) or (isinstance(value, list) and bool(value) and all(map(scalar, value)))


def parse_jsonl(text: str, source: str) -> list[dict[str, Any]]:
    """Tasks of a JSONL text, one per line."""
    tasks = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            raw = orjson.loads(stripped)
        except orjson.JSONDecodeError as exc:
            raise TasksFileError(f"{source} line {number}: not valid JSON: {exc}") from exc
        tasks.append(check_task(raw, f"{source} line {number}"))
    if not tasks:
        raise TasksFileError(f"{source}: no tasks")
    return tasks


def parse_yaml(text: str, source: str, base: Path | None = None) -> JobFile:
    """A YAML list of tasks, or a mapping with `tasks:` and other job fields."""
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise TasksFileError(f"{source} is not valid YAML: {exc}") from exc
    if isinstance(data, list):
        return JobFile(_yaml_tasks(data, root, source))
    if isinstance(data, Mapping):
        if "tasks" not in data and "tasks_source" in data:
            job = {str(k): v for k, v in data.items()}
            return JobFile(_tasks_source(job, base, source), job)
        if "tasks" not in data:
            raise TasksFileError(f"{source}: a mapping needs a 'tasks' list")
        tasks_node = _mapping_value(root, "tasks")
        tasks = _yaml_tasks(data["tasks"], tasks_node, source)
        return JobFile(tasks, {str(k): v for k, v in data.items() if k != "tasks"})
    raise TasksFileError(f"{source} must hold a list of tasks or a mapping with 'tasks'")


def _mapping_value(node: Any, key: str) -> Any:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if getattr(key_node, "value", None) == key:
                return value_node
    return None


def _yaml_tasks(data: Any, node: Any, source: str) -> list[dict[str, Any]]:
    if not isinstance(data, list) or not data:
        raise TasksFileError(f"{source}: 'tasks' must be a non-empty list")
    items = node.value if isinstance(node, yaml.SequenceNode) else []
    tasks = []
    for i, raw in enumerate(data):
        line = f" line {items[i].start_mark.line + 1}" if i < len(items) else ""
        tasks.append(check_task(raw, f"{source}{line} (tasks[{i}])"))
    return tasks


def _tasks_source(job: dict[str, Any], base: Path | None, source: str) -> list[dict[str, Any]]:
    """The tasks a job's `tasks_source` names (today: `{"harbor": DIR}`)."""
    given = job.pop("tasks_source")
    if not isinstance(given, Mapping) or set(given) != {"harbor"}:
        raise TasksFileError(f'{source}: tasks_source must be {{"harbor": DIR}}')
    folder = Path(str(given["harbor"]))
    if not folder.is_absolute() and base is not None:
        folder = base / folder
    return load_harbor_tasks(folder)


def resolve_task_paths(task: dict[str, Any], base: Path) -> dict[str, Any]:
    """The task with relative node paths of `repo` and `tests` made absolute against `base`."""
    for field_name, keys in (("repo", ("path", "bundle", "tarball")), ("tests", ("path",))):
        spec = task.get(field_name)
        if not isinstance(spec, Mapping):
            continue
        resolved = dict(spec)
        for key in keys:
            value = resolved.get(key)
            if isinstance(value, str) and value and not value.startswith("/"):
                resolved[key] = str((base / value).resolve())
        task = {**task, field_name: resolved}
    return task


def parse_json(text: str, source: str, base: Path | None = None) -> JobFile:
    """A JSON job object or a JSON list of tasks."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TasksFileError(f"{source} is not valid JSON: {exc}") from exc
    tasks: Any
    if isinstance(data, list):
        tasks = data
        job: dict[str, Any] = {}
    elif isinstance(data, dict):
        tasks = data.get("tasks")
        job = {k: v for k, v in data.items() if k != "tasks"}
        if "tasks_source" in job and tasks is None:
            return JobFile(_tasks_source(job, base, source), job)
    else:
        raise TasksFileError(f"{source} must hold a job object or a list of tasks")
    if not isinstance(tasks, list) or not tasks:
        raise TasksFileError(f"{source}: 'tasks' must be a non-empty list")
    return JobFile([check_task(t, f"{source} tasks[{i}]") for i, t in enumerate(tasks)], job)


def load_job_file(path: Path) -> JobFile:
    """Read a job or tasks file, choosing the format by its suffix (a directory: Harbor tasks)."""
    if path.is_dir():
        return JobFile(load_harbor_tasks(path))
    suffix = path.suffix.lower()
    if suffix not in (*JSON_SUFFIXES, *JSONL_SUFFIXES, *YAML_SUFFIXES):
        known = ", ".join((*JSON_SUFFIXES, *JSONL_SUFFIXES, *YAML_SUFFIXES))
        raise TasksFileError(f"{path}: unknown file type {suffix or '(none)'}; known: {known}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TasksFileError(f"cannot read {path}: {exc}") from exc
    source, base = path.name, path.resolve().parent
    if suffix in JSONL_SUFFIXES:
        loaded = JobFile(parse_jsonl(text, source))
    elif suffix in YAML_SUFFIXES:
        loaded = parse_yaml(text, source, base)
    else:
        loaded = parse_json(text, source, base)
    loaded.tasks = [resolve_task_paths(task, base) for task in loaded.tasks]
    return loaded
