"""Export a job's results as training data: one row per training sample, JSONL or Parquet.

Rows come from pages of the results API (`include_trajectories=true`) and are written page by
page, so memory is bounded by one page whatever the size of the job. The file is written under a
temporary name and renamed when complete: a failed export never leaves a truncated file that
looks finished.

Both formats have the same columns, so `datasets.load_dataset("json" | "parquet", data_files=...)`
gives the same dataset:

| column | type | meaning |
|---|---|---|
| job_id, group_id, rollout_id | string | `group_id` = `<job id>:<task index>` |
| task_index, sample_index, attempt | int | the group, the rollout within it, its attempt |
| trajectory_index | int | the training sample within the rollout (one per call for per_call) |
| prompt_ids, response_ids, loss_mask | list of int | token arrays exactly as stored |
| logprobs | list of float32, or null | aligned with response_ids |
| reward | float or null | null for infrastructure failures and unscored rollouts |
| advantage | float or null | only with `advantages="grpo"`; null for unusable samples |
| status, termination_reason | string | how the rollout ended |
| usable | bool | counts in group statistics (agent outcome with a reward) |
| group_incomplete | bool | the group lost samples to infrastructure failures |
| policy_versions | list of int | distinct policy versions that produced this sample |
| policy_version_min, policy_version_max | int or null | |
| task, metadata | string (JSON) | the task instance; the builder's metadata of this sample |

`task` and `metadata` are JSON strings rather than nested columns because their keys differ
between tasks and builders, which a columnar schema (and `datasets`) cannot hold in one column.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import orjson

PARQUET_TOKENS_PER_GROUP = 1_000_000
"""Tokens buffered before a Parquet row group is written: bounds the writer's memory (tens of
MB of Python lists) while keeping row groups large enough to read efficiently."""


class ExportFormat(StrEnum):
    JSONL = "jsonl"
    PARQUET = "parquet"


def resolve_format(path: Path, format: str | None) -> ExportFormat:
    """The given format, else the one the file suffix names, else JSONL."""
    if format is None:
        suffix = path.suffix.lower().lstrip(".")
        return ExportFormat.PARQUET if suffix == "parquet" else ExportFormat.JSONL
    try:
        return ExportFormat(format.lower())
    except ValueError:
        known = ", ".join(f.value for f in ExportFormat)
        raise ValueError(f"unknown export format {format!r}; known: {known}") from None


@dataclass(frozen=True, slots=True)
class ExportSummary:
    path: Path
    format: ExportFormat
    groups: int
    rows: int
    job_finished: bool
    """False: the job was still running, only the groups available then were exported."""
    artifacts: int = 0
    """Artifact files saved beside the export (`artifacts_dir`)."""


def _versions(meta: Mapping[str, Any]) -> list[int]:
    raw = meta.get("policy_versions")
    if not isinstance(raw, list):
        return []
    return sorted({v for v in raw if isinstance(v, int) and not isinstance(v, bool)})


def training_rows(
    job_id: str, group: Mapping[str, Any], with_advantage: bool
) -> Iterator[dict[str, Any]]:
    """The export rows of one group (as the results API returns it, with trajectories)."""
    task = orjson.dumps(group.get("task") or {}).decode()
    for sample in group["samples"]:
        for index, piece in enumerate(sample.get("trajectories") or []):
            meta = piece.get("meta") or {}
            versions = _versions(meta)
            row: dict[str, Any] = {
                "job_id": job_id,
                "group_id": group["group_id"],
                "task_index": group["task_index"],
                "rollout_id": str(sample["rollout_id"]),
                "sample_index": sample["sample_index"],
                "attempt": sample["attempt"],
                "trajectory_index": index,
                "prompt_ids": piece["prompt_ids"],
                "response_ids": piece["response_ids"],
                "loss_mask": piece["loss_mask"],
                "logprobs": piece["logprobs"],
                "reward": sample["reward"],
            }
            if with_advantage:
                row["advantage"] = sample.get("advantage")
            row.update(
                status=sample["status"],
                termination_reason=sample["termination_reason"],
                usable=sample["usable"],
                group_incomplete=group["incomplete"],
                policy_versions=versions,
                policy_version_min=versions[0] if versions else None,
                policy_version_max=versions[-1] if versions else None,
                task=task,
                metadata=orjson.dumps(meta).decode(),
            )
            yield row


def arrow_schema(with_advantage: bool) -> Any:
    """The Parquet schema (column order as in the module docstring)."""
    import pyarrow as pa

    ints = pa.list_(pa.int32())
    columns: list[tuple[str, Any]] = [
        ("job_id", pa.string()), ("group_id", pa.string()), ("task_index", pa.int32()),
        ("rollout_id", pa.string()), ("sample_index", pa.int32()), ("attempt", pa.int32()),
        ("trajectory_index", pa.int32()), ("prompt_ids", ints), ("response_ids", ints),
        ("loss_mask", ints), ("logprobs", pa.list_(pa.float32())), ("reward", pa.float64()),
    ]  # fmt: skip
    if with_advantage:
        columns.append(("advantage", pa.float64()))
    columns += [
        ("status", pa.string()), ("termination_reason", pa.string()), ("usable", pa.bool_()),
        ("group_incomplete", pa.bool_()), ("policy_versions", ints),
        ("policy_version_min", pa.int32()), ("policy_version_max", pa.int32()),
        ("task", pa.string()), ("metadata", pa.string()),
    ]  # fmt: skip
    return pa.schema(columns)


class ExportWriter:
    """Feed it result pages; `finish()` moves the complete file into place.

    Used as a context manager, an exception (or leaving without `finish()`) removes the
    partial file and leaves any earlier file at `path` untouched.
    """

    def __init__(
        self, path: Path, format: ExportFormat, job_id: str, with_advantage: bool = False
    ) -> None:
        self.path = Path(path)
        self.format = format
        self.job_id = job_id
        self.with_advantage = with_advantage
        self.groups = 0
        self.rows = 0
        self.job_finished = False
        self._partial = self.path.with_name(f".{self.path.name}.partial")
        self._file: BinaryIO | None = None
        self._parquet: Any = None
        self._buffer: list[dict[str, Any]] = []
        self._buffered_tokens = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if format is ExportFormat.PARQUET:
            import pyarrow.parquet as pq

            self._schema = arrow_schema(with_advantage)
            self._parquet = pq.ParquetWriter(str(self._partial), self._schema)
        else:
            self._file = self._partial.open("wb")

    def add_page(self, page: Mapping[str, Any]) -> None:
        """Write the rows of every group of one results page."""
        for group in page["groups"]:
            self.groups += 1
            for row in training_rows(self.job_id, group, self.with_advantage):
                self.rows += 1
                if self._file is not None:
                    self._file.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
                else:
                    self._buffer.append(row)
                    self._buffered_tokens += len(row["prompt_ids"]) + len(row["response_ids"])
                    if self._buffered_tokens >= PARQUET_TOKENS_PER_GROUP:
                        self._flush_parquet()
        self.job_finished = bool(page.get("job_finished"))

    def _flush_parquet(self) -> None:
        import pyarrow as pa

        if self._buffer:
            self._parquet.write_table(pa.Table.from_pylist(self._buffer, schema=self._schema))
            self._buffer = []
            self._buffered_tokens = 0

    def finish(self) -> ExportSummary:
        if self._parquet is not None:
            self._flush_parquet()
            self._parquet.close()
            self._parquet = None
        if self._file is not None:
            self._file.close()
            self._file = None
        os.replace(self._partial, self.path)
        return ExportSummary(self.path, self.format, self.groups, self.rows, self.job_finished)

    def abort(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
        if self._file is not None:
            self._file.close()
            self._file = None
        self._partial.unlink(missing_ok=True)

    def __enter__(self) -> ExportWriter:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.abort()
