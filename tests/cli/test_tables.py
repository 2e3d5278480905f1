"""The tables `polar-mq status | results | submit --wait` print, from the API's JSON (no server)."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console, RenderableType

from polar_mq.cli.tables import jobs_table, results_table, status_view

STATUS: dict[str, Any] = {
    "job_id": "j1", "state": "running", "created_at": "2026-12-06T06:00:00.1",
    "finished_at": None,
    "n_tasks": 2, "samples_per_task": 4, "total": 8, "terminal": 3,
    "stages": {"prepare": {"queued": 0, "running": 0}, "run_agent": {"queued": 2, "running": 3}},
    "by_status": {"completed": 2, "failed": 1}, "by_termination_reason": {"completed": 2,
    "backend_error": 1}, "groups_complete": 0, "groups_total": 2, "n_scored": 2,
    "mean_reward": 0.5,
    "errors": [{"reason": "backend_error", "count": 4, "error": "no engine answers the proxy at "
                "http://127.0.0.1:8000 (0 of 1 engines usable)"}],
}  # fmt: skip


def render(renderable: RenderableType) -> str:
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_status_shows_counts_stages_and_the_errors_of_retried_attempts() -> None:
    text = render(status_view(STATUS))
    assert "│ state       │ running" in text
    assert "│ rollouts    │ 3 of 8 ended (2 tasks x 4 samples)" in text
    assert "│ by status   │ 2 completed, 1 failed" in text
    assert "│ stages      │ run_agent: 3 running, 2 queued" in text  # idle stages left out
    assert "prepare" not in text
    assert "│ mean reward │ 0.5 over 2 scored" in text
    assert "errors (every attempt, retried ones included)" in text
    assert (
        "│ 4        │ backend_error │ no engine answers the proxy at http://127.0.0.1:8000" in text
    )


def test_status_without_errors_has_no_error_table() -> None:
    assert "errors" not in render(status_view({**STATUS, "errors": []}))


def test_results_one_row_per_group() -> None:
    sample = {"status": "completed", "termination_reason": "completed", "n_llm_calls": 2}
    groups = [
        {
            "task_index": 0, "task": {"instruction": "What is 6*7?", "answer": "42"},
            "mean_reward": 0.5,
            "samples": [{**sample, "reward": 1.0}, {**sample, "reward": 0.0},
                        {"status": "failed", "termination_reason": "backend_error",
                         "reward": None}],
        },
    ]  # fmt: skip
    text = render(results_table("j1", groups))
    assert (
        "│ 0 │ What is 6*7? │ 42     │ 1 0 -   │ 0.5  │ 2 completed, 1 backend_error │ 4 " in text
    )


def test_jobs_list() -> None:
    job = {"job_id": "j1", "state": "failed", "terminal": 8, "total": 8, "n_tasks": 2,
           "samples_per_task": 4, "created_at": "2026-12-06T06:00:00"}  # fmt: skip
    page = {"jobs": [job]}
    assert "│ j1  │ failed │ 8/8   │ 2 x 4" in render(jobs_table(page))
