"""What each dashboard page shows, gathered from the read services into one template context.

Routes stay thin: they check access, call one function here and render its dict. Every number
comes from the same read services as the REST API (job status, results with GRPO advantages,
rollout detail, calls, trajectory, artifacts), plus `ui.queries` for the aggregates only a page
needs.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session

from polar_mq.jobs import queries as job_queries
from polar_mq.jobs import results
from polar_mq.models.base import utcnow
from polar_mq.rollouts import artifact_queries
from polar_mq.rollouts import queries as rollout_queries
from polar_mq.ui import charts, plot_shapes, queries
from polar_mq.ui.call_body import call_parts
from polar_mq.ui.job_plots import job_plots
from polar_mq.ui.reward_view import explain, task_instance
from polar_mq.ui.timeline import timeline
from polar_mq.ui.tokens_text import TokenDecoder
from polar_mq.ui.trajectory_view import trajectory_views

JOBS_PER_PAGE = 50
GROUPS_PER_PAGE = 200
"""Groups in a job page's table; the rest on following pages (`?groups=<cursor>`)."""
INLINE_ARTIFACT_BYTES = 64 * 1024
"""Text artifacts up to this size are shown on the rollout page; longer ones show their tail."""
TEXT_MEDIA = ("text/", "application/json", "application/x-ndjson")


def jobs_page(session: Session, tenant: str | None, cursor: str | None) -> dict[str, Any]:
    jobs, next_cursor = queries.jobs_activity(session, JOBS_PER_PAGE, cursor, tenant)
    return {"jobs": jobs, "next_cursor": next_cursor, "stages": queries.STAGES}


def job_page(
    session: Session, job_id: uuid.UUID, groups_cursor: str | None = None
) -> dict[str, Any]:
    """Status, groups (statistics, advantages, histograms), progress, slowest and failed.

    Groups are listed in task order, GROUPS_PER_PAGE at a time from `groups_cursor` (a results
    cursor of `complete_only=False`)."""
    status = job_queries.job_status(session, job_id)
    page = results.job_results(
        session, job_id, groups_cursor, GROUPS_PER_PAGE, complete_only=False, advantages="grpo"
    )
    rewards = [
        s.reward for g in page.groups for s in g.samples if s.usable and s.reward is not None
    ]
    low, high = charts.reward_scale(rewards)
    hists = {
        g.group_id: charts.histogram(
            [s.reward for s in g.samples if s.usable and s.reward is not None], low, high
        )
        for g in page.groups
    }
    plots = job_plots(session, job_id)
    chart = charts.progress(
        status.created_at, queries.finish_times(session, job_id), 640, 120, status.total
    )
    return {
        "job": status,
        "stages": queries.STAGES,
        "groups": page.groups,
        "groups_next": page.next_cursor,
        "groups_cursor": groups_cursor,
        "hists": hists,
        "reward_low": low,
        "reward_high": high,
        "progress": chart,
        "stage_lines": charts.stage_lines(
            queries.stage_intervals(session, job_id), queries.STAGES, utcnow(), 640, 120
        ),
        "task_texts": queries.task_texts(session, job_id, [g.task_index for g in page.groups]),
        "plots": plots,
        "version_chart": plot_shapes.version_chart(plots.versions, 300, 84),
        "series": _series,
        "slowest": queries.slowest_rollouts(session, job_id),
        "failed": queries.failed_rollouts(session, job_id),
    }


def _series(values: list[int], bin_s: float, unit: str) -> list[plot_shapes.Bar]:
    return plot_shapes.series_bars(values, 300, 84, bin_s, unit)


def _artifact_text(session: Session, rollout_id: uuid.UUID, name: str, media: str) -> str | None:
    if not media.startswith(TEXT_MEDIA):
        return None
    content, _ = artifact_queries.artifact_content(session, rollout_id, name)
    tail = content[-INLINE_ARTIFACT_BYTES:]
    return tail.decode("utf-8", errors="replace")


def rollout_page(
    session: Session, rollout_id: uuid.UUID, decoder: TokenDecoder | None
) -> dict[str, Any]:
    """Detail, the reward explained, stage timeline, events, artifacts, LLM calls (their bodies
    load when opened: `ui.call_body`) and the highlighted trajectory."""
    detail = rollout_queries.rollout_detail(session, rollout_id)
    calls = rollout_queries.rollout_calls(session, rollout_id).calls
    trajectory = rollout_queries.rollout_trajectory(session, rollout_id)
    artifacts = artifact_queries.list_artifacts(session, rollout_id)
    texts = {
        a.name: _artifact_text(session, rollout_id, a.name, a.media_type)
        for a in artifacts.artifacts
    }
    return {
        "r": detail,
        "timeline": timeline(detail.events, utcnow()),
        "calls": calls,
        "artifacts": artifacts.artifacts,
        "artifact_texts": texts,
        "samples": trajectory_views(trajectory.samples, calls, decoder),
        "inline_bytes": INLINE_ARTIFACT_BYTES,
        "why": explain(detail, task_instance(session, rollout_id)),
        "call_parts": call_parts,
    }
