"""`polar-mq logs ROLLOUT_ID`: one rollout's log lines from every process, in time order."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import orjson
import typer

from polar_mq.cli.common import console, fail, load_settings


def logs(
    rollout_id: Annotated[str, typer.Argument(help="the rollout's id")],
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="directory of the JSON-lines files (POLAR_MQ_LOG_DIR)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the raw JSON lines")] = False,
) -> None:
    """Gather a rollout's lines from the log files of the API, proxy and workers."""
    from polar_mq.observability.log_files import (
        LogDirMissing,
        format_line,
        parse_rollout_id,
        rollout_lines,
    )

    try:
        rid = parse_rollout_id(rollout_id)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    log_dir = directory or load_settings().log_dir
    if log_dir is None:
        raise fail("no log directory: pass --dir DIR or set POLAR_MQ_LOG_DIR", 2)
    try:
        lines = rollout_lines(rid, log_dir)
    except LogDirMissing as exc:
        raise fail(str(exc), 2) from None
    if not lines:
        raise fail(f"no log lines for rollout {rid} in {log_dir}")
    for line in lines:
        if as_json:
            sys.stdout.write(orjson.dumps(line.record).decode() + "\n")
        else:
            console.print(format_line(line), markup=False, highlight=False, soft_wrap=True)
