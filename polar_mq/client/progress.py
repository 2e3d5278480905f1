"""The progress bar of `Client.wait(progress=True)` (rich, on the terminal)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any


def describe(status: Mapping[str, Any]) -> str:
    """The bar's text: complete groups, failures, mean reward."""
    failed = status["by_status"].get("failed", 0)
    reward = status.get("mean_reward")
    parts = [f"groups {status['groups_complete']}/{status['groups_total']}"]
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
