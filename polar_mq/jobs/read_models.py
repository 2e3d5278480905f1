"""Read models: the plain frozen dataclasses the read services return and the API serializes.

FastAPI derives the OpenAPI schema from these same classes, so the documented shape cannot drift
from the served one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal, TypeVar

from polar_mq.infra.errors import PolarError

_R = TypeVar("_R")

JobStateName = Literal[
    "running", "completed", "completed_with_failures", "failed", "cancelled", "stopped"
]
"""A job's state (`polar_mq.jobs.job_state` says when each applies)."""


class InvalidCursor(PolarError, ValueError):
    """A cursor that this server did not hand out (the API answers 400)."""

    status = 400
    type = "invalid_cursor"


@dataclass(frozen=True, slots=True)
class StageCount:
    queued: int = 0
    running: int = 0


@dataclass(frozen=True, slots=True)
class StalenessStatus:
    """Where a job with `staleness` stands against its capacity rule."""

    max_staleness: int
    batch_size: int
    on_stale: str
    base_version: int
    """The policy version when the job was submitted."""
    current_version: int
    capacity_groups: int
    """(max_staleness + current_version - base_version + 1) * batch_size."""
    admitted_groups: int
    stale_groups: int
    """Withheld or dropped as too old; they do not count against the capacity."""


@dataclass(frozen=True, slots=True)
class JobStatus:
    job_id: uuid.UUID
    state: JobStateName
    """running | completed (every rollout ended, none failed) | completed_with_failures (some
    completed, some failed: infrastructure failures) | failed (some failed, none completed) |
    cancelled (the job was cancelled, or every rollout was) | stopped (`stop.groups` reached, see
    `stop`). Every state but running means no rollout will change any more."""
    created_at: datetime
    cancelled_at: datetime | None
    """When the job was cancelled (`POST /v1/jobs/{id}/cancel` while rollouts were unfinished)."""
    finished_at: datetime | None
    """When the last rollout ended, once every rollout is terminal."""
    n_tasks: int
    samples_per_task: int
    total: int
    terminal: int
    stages: dict[str, StageCount]
    by_status: dict[str, int]
    """Terminal rollouts by status (completed, failed, cancelled)."""
    by_termination_reason: dict[str, int]
    groups_complete: int
    groups_total: int
    n_scored: int
    mean_reward: float | None
    """Over scored rollouts only: infrastructure failures carry no reward and never count as 0."""
    idempotency_key: str | None
    priority: int
    """0 (lowest, the default) to 9: higher-priority jobs' waiting stages are served first."""
    spec: dict[str, Any]
    metadata: dict[str, Any]
    held: int = 0
    """Rollouts waiting for the job's staleness capacity (created, no message sent yet)."""
    staleness: StalenessStatus | None = None
    stop: StopStatus | None = None
    """Present for a job with `stop`: its rule and, once applied, what the job stop did."""
    errors: list[ErrorCount] = field(default_factory=list)
    """The commonest failures of the job's attempts, retried ones included (`jobs.failures`)."""


@dataclass(frozen=True, slots=True)
class ErrorCount:
    """Failed attempts of a job sharing a reason and a signature (`jobs.failures`)."""

    reason: str | None
    error: str
    """The signature: the errors' last line, the platform's verdict."""
    count: int


@dataclass(frozen=True, slots=True)
class StopStatus:
    """A job's early-stop rule (`stop`) and what it has done so far."""

    usable_samples_per_group: int | None
    groups: int | None
    stragglers: str
    """cancel | withhold"""
    stopped: bool
    """The job reached `groups` complete groups and stopped."""
    stopped_at: datetime | None
    groups_complete_at_stop: int | None
    """Complete groups when the job stopped (at least `groups`)."""
    groups_stopped: int | None
    """Groups cut short by the stop: their unfinished rollouts were cancelled."""
    rollouts_cancelled: int | None
    """Rollouts the job stop cancelled (stragglers cancelled per group are not counted here)."""


@dataclass(frozen=True, slots=True)
class JobSummary:
    job_id: uuid.UUID
    state: JobStateName
    created_at: datetime
    n_tasks: int
    samples_per_task: int
    total: int
    terminal: int
    idempotency_key: str | None
    metadata: dict[str, Any]


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[JobSummary]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class TrajectoryTokens:
    """The training arrays of one sample; loss_mask and logprobs align with response_ids."""

    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float] | None
    meta: dict[str, Any]
    """What the builder recorded: call ids, policy_versions, finish reason, merge statistics."""


@dataclass(frozen=True, slots=True)
class PolicyVersions:
    """The policy versions that produced a rollout's tokens (several when weights changed)."""

    min: int
    max: int
    versions: list[int]
    """Distinct, ascending."""


@dataclass(frozen=True, slots=True)
class SampleResult:
    """One member of a group: one rollout (which may hold several training samples)."""

    group_id: str
    rollout_id: uuid.UUID
    sample_index: int
    status: str
    termination_reason: str | None
    usable: bool
    """Ended with an agent outcome and has a reward: counts in the group statistics."""
    reward: float | None
    """Null for infrastructure failures (never a silent 0) and for rollouts not yet scored."""
    advantage: float | None
    """GRPO advantage when asked for (advantages=grpo), usable samples of complete groups only."""
    attempt: int
    n_llm_calls: int | None
    policy_versions: PolicyVersions | None
    """From the training samples of the current attempt; null before build."""
    trajectories: list[TrajectoryTokens] | None
    """Present only when asked for (include_trajectories); never for a straggler."""
    straggler: bool = False
    """Not yet terminal when its group completed early (`stop.usable_samples_per_group`): kept
    out of the group (never usable, no advantage) whatever it ends with."""


@dataclass(frozen=True, slots=True)
class GroupResult:
    group_id: str
    """Stable id of the group: `<job id>:<task index>`."""
    task_index: int
    task: dict[str, Any]
    complete: bool
    """Every rollout is terminal, or `stop.usable_samples_per_group` of them ended usable: its
    usable samples will not change any more."""
    incomplete: bool
    """Complete, but with fewer usable samples than rollouts (or than
    `stop.usable_samples_per_group`): infrastructure failures, rollouts the evaluator could not
    score, or a group cut short by a job stop. The trainer decides whether to train on the rest."""
    completed_at: datetime | None
    cursor: str
    """Resume position just after this group."""
    n_samples: int
    n_usable: int
    mean_reward: float | None
    """Over usable samples only."""
    std_reward: float | None
    """Population standard deviation over usable samples."""
    samples: list[SampleResult]
    policy_versions: PolicyVersions | None = None
    """Over the group's samples: its oldest token's version is what staleness is judged on."""
    stale: str | None = None
    """withheld | dropped when the group was found too old for the trainer (never streamed)."""


@dataclass(frozen=True, slots=True)
class ResultsPage:
    job_id: uuid.UUID
    job_state: JobStateName
    job_finished: bool
    """Every rollout is terminal: no further group will complete."""
    groups: list[GroupResult]
    next_cursor: str | None
    """None when no further group is available now."""


@dataclass(frozen=True, slots=True)
class EventRecord:
    id: int
    stage: str
    kind: str
    attempt: int
    worker: str | None
    at: datetime
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StageTiming:
    started_at: datetime | None
    ended_at: datetime | None
    duration_s: float | None
    outcome: str
    """running | finished | failed | cancelled (the rollout was cancelled while it ran)"""


@dataclass(frozen=True, slots=True)
class EvaluationRecord:
    evaluator: str
    attempt: int
    reward: float | None
    detail: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RolloutDetail:
    rollout_id: uuid.UUID
    job_id: uuid.UUID
    task_index: int
    sample_index: int
    status: str
    stage: str | None
    """The stage the rollout is queued for or running in; None once terminal."""
    attempt: int
    node: str | None
    termination_reason: str | None
    agent_exit_code: int | None
    reward: float | None
    error: str | None
    n_llm_calls: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    timings: dict[str, StageTiming]
    """Per stage, for the current attempt."""
    runtime_id: str | None
    runtime: dict[str, Any]
    """The current attempt's runtime: where it came from (`source` pool | cold, `warm`), `start_s`,
    `recipe_s`, and once released `action` (recycled | destroyed) with `reset_s` or
    `teardown_s`."""
    evaluation: EvaluationRecord | None
    events: list[EventRecord]


@dataclass(frozen=True, slots=True)
class TrajectorySampleRecord:
    sample_index: int
    builder: str
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float] | None
    messages: list[Any] | None
    meta: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RolloutTrajectory:
    rollout_id: uuid.UUID
    attempt: int
    status: str
    reward: float | None
    samples: list[TrajectorySampleRecord]


@dataclass(frozen=True, slots=True)
class LlmCallRecord:
    id: uuid.UUID
    seq: int
    backend: str
    model: str | None
    api_type: str
    stream: bool
    policy_version: int
    status_code: int
    complete: bool
    finish_reason: str | None
    latency_ms: float
    ttft_ms: float | None
    created_at: datetime
    prompt_ids: list[int] | None
    completion_ids: list[int] | None
    logprobs: list[float] | None
    request: dict[str, Any]
    """The agent's request, in its API family's shape."""
    engine_request: dict[str, Any] | None
    """The chat request a translated family's call became (None for chat/completions calls)."""
    response: dict[str, Any] | None
    purpose: str
    """`agent` (training data), `auxiliary` (a side call of the harness: titles, memory; never
    trained on nor graded) or `judge` (an llm_judge scoring the rollout; never trained on)."""
    attempt: int
    """The rollout attempt that made the call; a restarted rollout trains on its last attempt's."""
    prompt_source: str = "chat"
    """`tito` (the proxy sent the previous call's ids plus the new messages') or `chat`."""
    tito_fallback: str | None = None
    """Why a call went the chat way although TITO was on (`polar_mq.proxy.tito`); else null."""


@dataclass(frozen=True, slots=True)
class RolloutCalls:
    rollout_id: uuid.UUID
    calls: list[LlmCallRecord]


def record(cls: type[_R], source: Any, **values: Any) -> _R:
    """A result dataclass filled from the same-named attributes of an ORM object or row."""
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name not in values:
            values[f.name] = getattr(source, f.name)
    return cls(**values)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One hand-out of a group to a consumer (see `polar_mq.jobs.deliveries`)."""

    delivery_id: str
    """`<group_id>:<delivery_count>`: acknowledges this hand-out, and no later one."""
    consumer: str
    delivery_count: int
    redelivered: bool
    """A previous lease of this group expired without an ack (its consumer died or was slow)."""
    leased_at: datetime
    lease_expires_at: datetime


@dataclass(frozen=True, slots=True)
class DeliveredGroup(GroupResult):
    """A complete group as leased to a consumer: the results shape plus its delivery."""

    delivery: Delivery = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class GroupLease:
    """The answer to a lease call (and the data of the stream's `end` event, without groups)."""

    job_id: uuid.UUID
    consumer: str
    groups: list[DeliveredGroup]
    """In completion order; empty when nothing became available within wait_s."""
    job_finished: bool
    """Every rollout is terminal: no further group will complete."""
    groups_total: int
    groups_acked: int
    groups_in_flight: int
    """Leased to some consumer (this one included), not acknowledged, lease not expired."""
    done: bool
    """Job finished and every group acknowledged or stale: nothing will be handed out again."""
    groups_stale: int = 0
    """Kept out of the stream as too old for the trainer (see `staleness`); in the results."""


@dataclass(frozen=True, slots=True)
class AckResult:
    acked: list[str]
    """Delivery ids acknowledged by this call."""
    already_acked: list[str]
    """Delivery ids this consumer had acknowledged before (acks are idempotent)."""


@dataclass(frozen=True, slots=True)
class ExtendResult:
    extended: list[str]
    lease_expires_at: datetime
