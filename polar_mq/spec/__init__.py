"""The job spec as stored and read: a frozen, versioned, typed `JobSpec` (see `model`; its
`sampling` a `SamplingSpec`, see `sampling`), loaded from any stored row through
`upgrade.load_spec`; and a task instance's read-only view (`task.TaskInstance`). Imports nothing
of polar_mq, so every package (lifecycle, policy, jobs, the plug-ins, workers) can read it."""

from polar_mq.spec.model import (
    DEFAULT_POOL,
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MIN_PRIORITY,
    SPEC_VERSION,
    TITO_MODES,
    EvaluationRuntimeSpec,
    HarnessSpec,
    JobSpec,
    PrepareRecipe,
    RetrySpec,
    RuntimeSpec,
    StalenessSpec,
    StopSpec,
    StoredStaleness,
    TimeoutSpec,
    TitoMode,
    workspace_path_problem,
)
from polar_mq.spec.sampling import SamplingSpec
from polar_mq.spec.task import TaskInstance
from polar_mq.spec.upgrade import SpecVersionError, load_spec, upgrade

__all__ = [
    "DEFAULT_POOL",
    "DEFAULT_PRIORITY",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "SPEC_VERSION",
    "TITO_MODES",
    "EvaluationRuntimeSpec",
    "HarnessSpec",
    "JobSpec",
    "PrepareRecipe",
    "RetrySpec",
    "RuntimeSpec",
    "SamplingSpec",
    "SpecVersionError",
    "StalenessSpec",
    "StopSpec",
    "StoredStaleness",
    "TaskInstance",
    "TimeoutSpec",
    "TitoMode",
    "load_spec",
    "upgrade",
    "workspace_path_problem",
]
