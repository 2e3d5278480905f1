"""What `polar-mq status | results | submit --wait` print for a person: rich tables made from the
API's JSON (which `--json` prints as it is, for scripts).

Each function takes the API's answer as a dict and returns a renderable, so the commands stay a
request plus a print, and the tables can be tested without a server.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

STATE_STYLES = {
    "running": "cyan",
    "completed": "green",
    "completed_with_failures": "yellow",
    "failed": "red",
    "cancelled": "magenta",
    "stopped": "blue",
}
ERROR_CHARS = 160
"""Characters of one error shown in a table cell (the whole text is in `--json`)."""


def state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, ""))


def _counts(values: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {name}" for name, n in values.items()) or "-"


def _reward(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def status_view(status: Mapping[str, Any]) -> Group:
    """One job: its state and counts, the stages' queues, and the errors of its attempts."""
    table = Table(title=f"job {status['job_id']}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("state", state_text(str(status["state"])))
    shape = f"{status['n_tasks']} tasks x {status['samples_per_task']} samples"
    table.add_row("rollouts", f"{status['terminal']} of {status['total']} ended ({shape})")
    table.add_row("by status", _counts(status.get("by_status") or {}))
    table.add_row("ended as", _counts(status.get("by_termination_reason") or {}))
    table.add_row("groups", f"{status['groups_complete']} of {status['groups_total']} complete")
    table.add_row("mean reward", f"{_reward(status.get('mean_reward'))} "
                  f"over {status.get('n_scored', 0)} scored")  # fmt: skip
    stages = status.get("stages") or {}
    busy = {s: c for s, c in stages.items() if c.get("queued") or c.get("running")}
    if busy:
        table.add_row("stages", ", ".join(
            f"{s}: {c.get('running', 0)} running, {c.get('queued', 0)} queued"
            for s, c in busy.items()
        ))  # fmt: skip
    table.add_row("created", str(status.get("created_at") or "-")[:19])
    if status.get("finished_at"):
        table.add_row("finished", str(status["finished_at"])[:19])
    parts: list[Table] = [table]
    errors = status.get("errors") or []
    if errors:
        parts.append(errors_table(errors))
    return Group(*parts)


def errors_table(errors: Iterable[Mapping[str, Any]]) -> Table:
    """The job's failures by reason and message, retried attempts included."""
    table = Table(title="errors (every attempt, retried ones included)", title_justify="left")
    for column in ("attempts", "reason", "error"):
        table.add_column(column)
    for error in errors:
        text = str(error.get("error") or "")
        if len(text) > ERROR_CHARS:
            text = text[:ERROR_CHARS] + "…"
        table.add_row(str(error.get("count", "")), str(error.get("reason") or "-"), text)
    return table


def jobs_table(page: Mapping[str, Any]) -> Table:
    """The list of jobs, newest first."""
    table = Table(title="jobs", title_justify="left")
    for column in ("job", "state", "ended", "tasks x samples", "created"):
        table.add_column(column)
    for job in page.get("jobs") or []:
        table.add_row(
            str(job["job_id"]), state_text(str(job["state"])),
            f"{job['terminal']}/{job['total']}", f"{job['n_tasks']} x {job['samples_per_task']}",
            str(job.get("created_at") or "")[:19],
        )  # fmt: skip
    return table


def results_table(job_id: str, groups: Iterable[Mapping[str, Any]]) -> Table:
    """A job's groups, one row each: the task, its rewards, how its rollouts ended (the demo's
    table, without the per-rollout timing requests)."""
    table = Table(title=f"results of job {job_id}", title_justify="left")
    for column in ("#", "task", "answer", "rewards", "mean", "ended", "calls"):
        table.add_column(column)
    for group in groups:
        ended: Counter[str] = Counter()
        rewards, calls = [], 0
        for sample in group.get("samples") or []:
            ended[sample.get("termination_reason") or sample["status"]] += 1
            rewards.append("-" if sample.get("reward") is None else f"{sample['reward']:g}")
            calls += sample.get("n_llm_calls") or 0
        task = group.get("task") or {}
        table.add_row(
            str(group["task_index"]), str(task.get("instruction", ""))[:80],
            str(task.get("answer", "")), " ".join(rewards), _reward(group.get("mean_reward")),
            _counts(dict(ended)), str(calls),
        )  # fmt: skip
    return table
