"""Calls about to be pruned, written to gzipped JSONL before they are deleted.

One file per pruned partition (`calls-<partition>-<cutoff>.jsonl.gz`), one line per call with
every `llm_calls` column as stored plus the rollout's `job_id`: token arrays as lists of ints
(logprobs as floats), request/response as JSON objects, times in ISO 8601. Like the job export
(`polar_mq.client.export`) the file is written under a hidden `.partial` name and renamed once
complete and synced, so a file that exists is whole; the prune deletes rows only after that rename,
in the same transaction, so an export that fails deletes nothing.
"""

from __future__ import annotations

import gzip
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Connection, Select

FETCH_ROWS = 2000
"""Rows fetched per round trip from the server-side cursor: bounded memory at any size."""


def export_path(directory: Path, partition: str, cutoff: datetime) -> Path:
    return directory / f"calls-{partition}-{cutoff:%Y%m%dT%H%M%SZ}.jsonl.gz"


def write_calls(conn: Connection, query: Select[Any], path: Path) -> int:
    """Stream `query`'s rows (call columns + job_id) into `path`; returns the number of rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    rows = 0
    try:
        with partial.open("wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=3) as out:
                # Per statement: Connection.execution_options would stream every later statement.
                stream = {"stream_results": True, "yield_per": FETCH_ROWS}
                result = conn.execute(query, execution_options=stream)
                for row in result.mappings():
                    out.write(
                        orjson.dumps(
                            {str(k): v for k, v in row.items()},
                            option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_UTC_Z,
                        )
                    )
                    rows += 1
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return rows
