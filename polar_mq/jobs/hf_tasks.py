"""Tasks from a Hugging Face dataset: a `datasets.Dataset`, a folder saved with `save_to_disk`,
local data files, or a hub name already in the local cache.

`datasets` is imported only when this is called: the API, the workers and the trainer-side client
do not need it. Nothing here downloads on its own account; with `HF_HUB_OFFLINE=1` a hub name
resolves from the cache or fails with a clear error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from polar_mq.jobs.task_errors import TasksFileError
from polar_mq.jobs.tasks_file import check_task


def _open(dataset_or_path: Any, split: str) -> Any:
    """A `datasets.Dataset` for a Dataset, DatasetDict, saved folder, data file or hub name."""
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise TasksFileError("loading Hugging Face datasets needs `pip install datasets`") from exc
    data = dataset_or_path
    if isinstance(data, str | Path):
        path = Path(data)
        try:
            if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
                data = datasets.load_from_disk(str(path))
            elif path.is_file():
                kind = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
                if path.suffix not in kind:
                    raise TasksFileError(f"{path}: unsupported data file type {path.suffix}")
                data = datasets.load_dataset(kind[path.suffix], data_files=str(path), split=split)
            else:
                data = datasets.load_dataset(str(data), split=split)
        except (FileNotFoundError, ValueError, OSError) as exc:
            if isinstance(exc, TasksFileError):
                raise
            raise TasksFileError(f"cannot load dataset {data}: {exc}") from exc
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise TasksFileError(f"dataset has no split {split!r}; splits: {', '.join(data)}")
        data = data[split]
    if not isinstance(data, datasets.Dataset):
        raise TasksFileError(f"not a dataset: {type(data).__name__}")
    return data


def load_hf_tasks(
    dataset_or_path: Any,
    split: str = "train",
    instruction_field: str = "question",
    answer_field: str | None = "answer",
    limit: int | None = None,
    metadata_fields: tuple[str, ...] = (),
    answer_transform: Callable[[Any], Any] | None = None,
) -> list[dict[str, Any]]:
    """Tasks `{instruction, answer, metadata}` from the rows of a dataset split.

    `answer_field=None` makes tasks without answers (for evaluators that do not need one);
    `answer_transform` turns a raw answer into the one to match (e.g. GSM8K's text after `####`).
    `metadata` records where each task came from (`split`, `row`) plus any `metadata_fields`.
    """
    if limit is not None and limit < 1:
        raise TasksFileError("limit must be at least 1")
    data = _open(dataset_or_path, split)
    columns = set(data.column_names)
    for name in (instruction_field, answer_field, *metadata_fields):
        if name is not None and name not in columns:
            raise TasksFileError(
                f"dataset has no column {name!r}; columns: {', '.join(sorted(columns))}"
            )
    if limit is not None:
        data = data.select(range(min(limit, len(data))))
    tasks = []
    for row_number, row in enumerate(data):
        task: dict[str, Any] = {"instruction": row[instruction_field]}
        if answer_field is not None:
            answer = row[answer_field]
            if answer_transform is not None:
                answer = answer_transform(answer)
            task["answer"] = answer if isinstance(answer, list) else str(answer)
        meta = {"split": split, "row": row_number}
        meta.update({name: row[name] for name in metadata_fields})
        task["metadata"] = meta
        tasks.append(check_task(task, f"dataset row {row_number}"))
    return tasks
