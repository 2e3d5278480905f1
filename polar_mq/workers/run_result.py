"""What one run of a stage came to (`runner.run_stage`): a kind and its detail.

Typed so that the task (`workers.tasks`) decides a Celery state by kind and tests compare
results, not string prefixes. `str()` is the text the runner returned before it was typed
(`failed:builder_error`, `lease_lost`): the task still returns and raises that text, so the
result backend, Flower and the stage metrics' labels (`observability.stage_metrics.outcome_of`,
which reads the head before `:`) see what they always did.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from polar_mq.lifecycle.recovery import Recovery


class RunKind(StrEnum):
    """How a stage run ended; the value is the head of the result's text."""

    DONE = "done"
    """The stage's result is committed and the next stage published."""
    SKIPPED = "skipped"
    """A duplicate or stale delivery: the rollout had moved on (detail: its status, or why)."""
    FAILED = "failed"
    """The rollout ended as failed (detail: its termination reason)."""
    RETRY = "retry"
    """The stage raised and was sent back to its queue (detail: the retry's number)."""
    RESTART = "restart"
    """The agent stage raised; the attempt was given up (detail: the `lifecycle.recovery.Recovery`
    `restart_claimed` returned: `requeued`, `failed` or `raced`)."""
    LEASE_LOST = "lease_lost"
    """The rollout was taken meanwhile (cancelled, restarted elsewhere): nothing was kept."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """One stage run's result: `kind`, and `detail` for the kinds that carry one."""

    kind: RunKind
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.detail}" if self.detail else self.kind.value

    @classmethod
    def done(cls) -> RunResult:
        return cls(RunKind.DONE)

    @classmethod
    def skipped(cls, status: str) -> RunResult:
        return cls(RunKind.SKIPPED, status)

    @classmethod
    def failed(cls, reason: str) -> RunResult:
        return cls(RunKind.FAILED, reason)

    @classmethod
    def retry(cls, number: int) -> RunResult:
        return cls(RunKind.RETRY, str(number))

    @classmethod
    def restart(cls, result: Recovery) -> RunResult:
        return cls(RunKind.RESTART, result.value)

    @classmethod
    def lease_lost(cls) -> RunResult:
        return cls(RunKind.LEASE_LOST)
