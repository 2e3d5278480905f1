"""SQLAlchemy models: the source of truth for jobs, rollouts, LLM calls and trajectories."""

from polar_mq.models.api_key import ApiKey
from polar_mq.models.artifact import RolloutArtifact
from polar_mq.models.base import Base
from polar_mq.models.event import Event, EventKind
from polar_mq.models.group_delivery import GroupDelivery
from polar_mq.models.job import Job, JobTask
from polar_mq.models.llm_call import LlmCall
from polar_mq.models.policy import DEFAULT_POLICY, PolicyState, StaleAction, StaleGroup
from polar_mq.models.rollout import Rollout, RolloutStatus, TerminationReason
from polar_mq.models.trajectory import Evaluation, TrajectorySample

__all__ = [
    "DEFAULT_POLICY",
    "ApiKey",
    "Base",
    "Evaluation",
    "Event",
    "EventKind",
    "GroupDelivery",
    "Job",
    "JobTask",
    "LlmCall",
    "PolicyState",
    "Rollout",
    "RolloutArtifact",
    "RolloutStatus",
    "StaleAction",
    "StaleGroup",
    "TerminationReason",
    "TrajectorySample",
]
