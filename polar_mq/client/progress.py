"""The progress bar of `Client.wait(progress=True)` (rich, on the terminal)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

STATE_STYLES = {
    "completed": "green", "completed_with_failures": "dark_orange", "failed": "red",
    "cancelled": "grey50", "stopped": "yellow",
}  # fmt: skip
"""The colour of each ended job state (the dashboard's, as near as a terminal gets)."""


def describe(status: Mapping[str, Any]) -> str:
    """The bar's text: the state once the job ended, complete groups, failures, mean reward."""
    failed = status["by_status"].get("failed", 0)
    reward = status.get("mean_reward")
    parts = [f"groups {status['groups_complete']}/{status['groups_total']}"]
    state = str(status.get("state", "running"))
    if state in STATE_STYLES:
        style = STATE_STYLES[state]
        parts.insert(0, f"[{style}]{state.replace('_', ' ')}[/]")
    if failed:
        parts.append(f"[red]failed {failed}[/]")
    if reward is not None:
        parts.append(f"reward {reward:.3f}")
    return "  ".join(parts)


@contextmanager
def job_progress(job_id: str) -> Iterator[Callable[[Mapping[str, Any]], None]]:
    """A bar for one job while the block runs; the callable shows each polled status."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
    )  # fmt: skip
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(f"job {job_id[:8]}", total=None, info="")

        def show(status: Mapping[str, Any]) -> None:
            bar.update(
                task, total=status["total"], completed=status["terminal"], info=describe(status)
            )

        yield show
