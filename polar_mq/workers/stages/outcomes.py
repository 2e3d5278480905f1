"""What each stage came to, typed: `Prepared`, `AgentRan`, `Built`, `Evaluated`.

A stage returns one; the runner commits it (`runner._finish`) as the columns set on the rollout,
the rows inserted and the detail of the stage's `finished` event. That stored form is the contract
(the UI, the API, the metrics and the benchmarks read it), so each outcome writes exactly the
columns, row shapes and detail keys the stage wrote before it was typed, in the same order. Only
what the stage measures and the platform never reads stays free-form (`runtime`, `grading`, a
builder's `stats`): it goes to the event as it is.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table

from polar_mq.evaluators import EvalResult
from polar_mq.lifecycle.transitions import RolloutRef
from polar_mq.models import Evaluation, RolloutArtifact, TrajectorySample
from polar_mq.models.base import utcnow
from polar_mq.trajectories.base import BuildResult

ARTIFACTS = cast(Table, RolloutArtifact.__table__)
EVALUATIONS = cast(Table, Evaluation.__table__)
SAMPLES = cast(Table, TrajectorySample.__table__)

Rows = dict[Table, list[dict[str, Any]]]


class StageOutcome(ABC):
    """A stage's result, before it is committed."""

    __slots__ = ()

    @abstractmethod
    def columns(self) -> dict[str, Any]:
        """The rollout's columns this stage sets."""

    def rows(self) -> Rows:
        """Rows to insert with the result, per table."""
        return {}

    @abstractmethod
    def detail(self) -> dict[str, Any]:
        """The `finished` event's detail (the runner adds `duration_s`)."""

    def next_node(self) -> str | None:
        """The node the next stage runs on when this stage chose it; None: the rollout's."""
        return None


@dataclass(frozen=True, slots=True)
class Prepared(StageOutcome):
    """The runtime is ready on `node`: run agent and evaluate are routed there."""

    node: str
    runtime_id: str
    runtime: dict[str, Any]
    """Where the runtime came from and what it cost (`source`, `warm`, `start_s`, `recipe_s`, the
    warm pool's own keys; `repo` for a checked-out repository): the event's, as measured."""

    def next_node(self) -> str:
        return self.node

    def columns(self) -> dict[str, Any]:
        return {"node": self.node, "runtime_id": self.runtime_id}

    def detail(self) -> dict[str, Any]:
        return {"node": self.node, "runtime_id": self.runtime_id, "runtime": self.runtime}


@dataclass(frozen=True, slots=True)
class AgentRan(StageOutcome):
    """The agent ran and its calls are stored; how it ended, and where the stage's time went."""

    termination_reason: str
    exit_code: int | None
    """The agent's status (None: killed for its timeout or inactivity)."""
    error: str | None
    """Why it failed in its own words; None for a completed agent (clears an earlier attempt's)."""
    timed_out: bool
    inactive: bool
    agent_s: float
    setup_s: float
    """Before the agent: its token, files and the time budget."""
    reap_s: float
    """Between the agent's end and the stage seeing it."""
    flush_s: float
    """Waiting until every call is stored (receipts or the proxy's flush)."""
    collect_s: float
    """Reading the calls and the artifacts."""
    proxy_written_total: int
    calls_stored_by: str
    """`receipts`, or `flush` (the proxy's)."""
    calls_started: int | None
    wakeups: int | None
    agent_calls: int
    auxiliary_calls: int
    artifacts: list[dict[str, Any]]
    """`rollout_artifacts` rows."""
    grading: dict[str, Any] = field(default_factory=dict)
    """The evaluation runtime prepared while the agent ran, when the job grades in its own."""

    def columns(self) -> dict[str, Any]:
        return {
            "termination_reason": self.termination_reason,
            "agent_exit_code": self.exit_code,
            "error": self.error,
        }

    def rows(self) -> Rows:
        return {ARTIFACTS: self.artifacts}

    def detail(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "inactive": self.inactive,
            "agent_s": self.agent_s,
            "setup_s": self.setup_s,
            "reap_s": self.reap_s,
            "flush_s": self.flush_s,
            "collect_s": self.collect_s,
            "proxy_written_total": self.proxy_written_total,
            "calls_stored_by": self.calls_stored_by,
            "calls_started": self.calls_started,
            "wakeups": self.wakeups,
            "agent_calls": self.agent_calls,
            "auxiliary_calls": self.auxiliary_calls,
            "artifacts": [row["name"] for row in self.artifacts],
            **self.grading,
        }


@dataclass(frozen=True, slots=True)
class Built(StageOutcome):
    """The attempt's agent calls (`calls` of them) became `built.samples` by `builder`."""

    rollout: RolloutRef
    builder: str
    calls: int
    built: BuildResult
    created_at: datetime = field(default_factory=utcnow)

    def columns(self) -> dict[str, Any]:
        return {"n_llm_calls": self.calls}

    def rows(self) -> Rows:
        return {SAMPLES: self.sample_rows()}

    def sample_rows(self) -> list[dict[str, Any]]:
        """The `trajectory_samples` rows, in sample order."""
        return [
            {
                "rollout_id": self.rollout.id,
                "attempt": self.rollout.attempt,
                "sample_index": i,
                "builder": self.builder,
                "prompt_ids": sample.prompt_ids,
                "response_ids": sample.response_ids,
                "loss_mask": sample.loss_mask,
                "logprobs": sample.logprobs,
                "messages": sample.messages,
                "metadata": sample.meta,  # the column name (the ORM attribute is `meta`)
                "created_at": self.created_at,
            }
            for i, sample in enumerate(self.built.samples)
        ]

    def detail(self) -> dict[str, Any]:
        return {"builder": self.builder, **self.built.stats}


@dataclass(frozen=True, slots=True)
class Evaluated(StageOutcome):
    """The rollout is scored: `result` by `evaluator`, on `final_text` when it read the answer."""

    rollout_id: uuid.UUID
    attempt: int
    evaluator: str
    result: EvalResult
    final_text: str | None
    grading: dict[str, Any] = field(default_factory=dict)
    """The grading runtime's measures (`tampering`: files dropped from a graded diff)."""
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    """The graded `workspace.diff`, replacing the run-agent stage's, when graded from the diff."""
    created_at: datetime = field(default_factory=utcnow)

    @property
    def reward(self) -> float | None:
        return self.result.reward

    def columns(self) -> dict[str, Any]:
        return {"reward": self.reward}

    def rows(self) -> Rows:
        return {EVALUATIONS: [self.evaluation_row()], **self._artifact_rows()}

    def evaluation_row(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "attempt": self.attempt,
            "evaluator": self.evaluator,
            "reward": self.reward,
            "detail": self.result.detail,
            "created_at": self.created_at,
        }

    def _artifact_rows(self) -> Rows:
        return {ARTIFACTS: self.artifacts} if self.artifacts else {}

    def detail(self) -> dict[str, Any]:
        return {"reward": self.reward, "final_text": (self.final_text or "")[:200], **self.grading}
