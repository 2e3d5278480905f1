"""The job submission schema: everything a trainer can ask for, validated before anything is stored.

Unknown fields are refused (a typo in a spec must not silently fall back to a default), numbers
and booleans are strict (`"5"` or `true` is not a count: a spec that says so has a bug), and
harness, evaluator and builder names are resolved at submit time so a bad job is a 4xx, never a
fleet of failing rollouts. `prepare.files` keys must stay inside the workspace (relative, no `..`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from polar_mq import spec
from polar_mq.capability.sampling import validate_sampling
from polar_mq.evaluators.registry import get_evaluator, validate_evaluator_spec
from polar_mq.harnesses import get_harness
from polar_mq.harnesses.presets.registry import harness_trusted
from polar_mq.jobs.evaluator_choice import default_evaluator, evaluator_label, task_fields_problem
from polar_mq.runtimes.options import check_runtime_options, effective_network
from polar_mq.spec.model import (
    DEFAULT_POOL,
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MAX_SAMPLES,
    MAX_TASKS,
    MIN_PRIORITY,
    JobSpec,
    PrepareRecipe,
    RetrySpec,
    StalenessSpec,
    StopSpec,
    StoredStaleness,
    TimeoutSpec,
    TitoMode,
    workspace_path_problem,
)
from polar_mq.swe.spec import TaskSpecError, validate_task_fields
from polar_mq.trajectories.registry import validate_builder_name

__all__ = [
    "MAX_SAMPLES",
    "MAX_TASKS",
    "HarnessSpec",
    "JobCreate",
    "PrepareRecipe",
    "RetrySpec",
    "RuntimeSpec",
    "StalenessSpec",
    "StopSpec",
    "TimeoutSpec",
    "workspace_path_problem",
]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HarnessSpec(spec.HarnessSpec):
    """The stored harness spec, resolved against the harness registry at the door."""

    @model_validator(mode="after")
    def _resolvable(self) -> HarnessSpec:
        get_harness(self)
        return self


class RuntimeSpec(spec.RuntimeSpec):
    """The stored runtime spec, its options checked against the runtime kind at the door."""

    @model_validator(mode="after")
    def _options_fit_kind(self) -> RuntimeSpec:
        check_runtime_options(self)
        return self


TASK_ITEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["instruction"],
    "properties": {"instruction": {"type": "string", "minLength": 1, "pattern": r"\S"}},
    "additionalProperties": True,
}
"""What `_tasks_have_instruction` checks, told to OpenAPI: a task is free-form except for its
non-blank `instruction` (SWE fields are checked further, see `polar_mq.swe.spec`)."""


class JobCreate(StrictModel):
    tasks: list[dict[str, Any]] = Field(
        ...,
        min_length=1,
        max_length=MAX_TASKS,
        description="task instances: an 'instruction' and whatever the evaluator needs",
        json_schema_extra={"items": TASK_ITEM_SCHEMA},
    )
    samples_per_task: int = Field(1, ge=1, le=MAX_SAMPLES, strict=True)
    harness: HarnessSpec = Field(default_factory=lambda: HarnessSpec())
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    evaluator: str | dict[str, Any] | None = Field(
        None,
        description="name, {name, …}, or path; default: exact_match when every task has an "
        "answer, tests when every task has hidden tests, completed when none has either (a mix "
        "is refused); every task must carry the fields the evaluator reads",
    )
    builder: str = Field(
        "per_call", description="per_call, prefix_merge, or an import path 'package.module:attr'"
    )
    max_tokens_per_rollout: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        strict=True,
        description="token budget of each rollout attempt: completion tokens its agent may "
        "generate over all its calls (the proxy clamps each call to what is left and refuses "
        "calls once it is spent; the rollout ends token_budget). Default and upper bound: the "
        "tenant's max_tokens_per_rollout quota",
    )
    sampling: dict[str, Any] = Field(
        default_factory=dict,
        description="temperature, top_p, top_k, max_tokens…, and enforce: override | clamp | off, "
        "or {field: mode} (default: override temperature and top_p, clamp max_tokens), how the "
        "proxy applies them to the agent's calls",
    )
    stop: StopSpec | None = Field(
        None, description="over-provisioning: complete groups early and/or stop the job early"
    )
    timeouts: TimeoutSpec = Field(default_factory=TimeoutSpec)
    retries: RetrySpec = Field(default_factory=RetrySpec)
    model: str | None = Field(None, description="model name the agent is told to use")
    staleness: StalenessSpec | None = Field(
        None, description="asynchronous RL: admit rollouts by policy version (see docs/async_rl.md)"
    )
    tito: TitoMode = Field(
        "auto",
        description="token-in/token-out: auto (as the proxy's proxy_tito says) or off (every call "
        "goes the chat way: the template renders the history, e.g. drops earlier reasoning); "
        "see docs/tito.md",
    )
    pool: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_-]{1,64}$", description="worker pool; default: the API's pool"
    )
    priority: int = Field(
        DEFAULT_PRIORITY,
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        strict=True,
        description="0 (default, lowest) to 9 (highest): waiting stage messages of a "
        "higher-priority job are served first (Redis and RabbitMQ; ignored by the embedded broker)",
    )
    metadata: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(None, min_length=1, max_length=200)

    @field_validator("tasks")
    @classmethod
    def _tasks_have_instruction(cls, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, task in enumerate(tasks):
            instruction = task.get("instruction")
            if not isinstance(instruction, str) or not instruction.strip():
                raise ValueError(f"tasks[{i}] needs a non-empty string 'instruction'")
            try:
                validate_task_fields(task)  # a repository and hidden tests (SWE tasks)
            except TaskSpecError as exc:
                raise ValueError(f"tasks[{i}]: {exc}") from exc
        return tasks

    @model_validator(mode="after")
    def _stop_fits_job(self) -> JobCreate:
        """The stop rule must be reachable: never more usable samples or groups than exist."""
        if self.stop is None:
            return self
        needed = self.stop.usable_samples_per_group
        if needed is not None and needed > self.samples_per_task:
            raise ValueError(
                f"stop.usable_samples_per_group ({needed}) exceeds samples_per_task "
                f"({self.samples_per_task})"
            )
        if self.stop.groups is not None and self.stop.groups > len(self.tasks):
            raise ValueError(
                f"stop.groups ({self.stop.groups}) exceeds the number of tasks ({len(self.tasks)})"
            )
        return self

    @field_validator("sampling")
    @classmethod
    def _sampling_enforceable(cls, value: dict[str, Any]) -> dict[str, Any]:
        validate_sampling(value)
        return value

    @field_validator("evaluator")
    @classmethod
    def _evaluator_known(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if value is not None:
            validate_evaluator_spec(value)
        return value

    @model_validator(mode="after")
    def _evaluator_fits_tasks(self) -> JobCreate:
        """Pick the default evaluator by the one rule, and refuse tasks it cannot score
        (`polar_mq.jobs.evaluator_choice`): stored explicitly, so a reward never changes meaning."""
        if self.evaluator is None:
            self.evaluator = default_evaluator(self.tasks)
        problem = task_fields_problem(
            get_evaluator(self.evaluator), evaluator_label(self.evaluator), self.tasks
        )
        if problem is not None:
            raise ValueError(problem)
        return self

    @field_validator("builder")
    @classmethod
    def _builder_known(cls, value: str) -> str:
        validate_builder_name(value)
        return value

    def job_spec(self, pool: str | None = None, base_version: int = 0) -> JobSpec:
        """The typed spec every stage reads (tasks and metadata are stored apart).

        `pool`: the pool the job runs in (`self.pool`, else the API's default); `base_version`:
        the trainer's policy version at submit, kept with a staleness rule.
        """
        data = self.model_dump(
            exclude_none=True,
            exclude={"tasks", "metadata", "idempotency_key", "samples_per_task", "pool"},
        )
        if self.staleness is not None:
            data["staleness"] = StoredStaleness(
                **self.staleness.model_dump(), base_version=base_version
            )
        data["runtime"] = {**data.get("runtime", {}), "network": self._effective_network()}
        return JobSpec.model_validate({**data, "pool": self.pool or pool or DEFAULT_POOL})

    def _effective_network(self) -> str:
        """The runtime's network as resolved at submit and stored: an explicit choice is kept;
        unset, a third-party preset under bwrap/docker gets proxy_only (`effective_network`)."""
        runtime = self.runtime
        chosen = runtime.network if "network" in runtime.model_fields_set else None
        trusted = harness_trusted(self.harness.type)
        return effective_network(runtime.kind, chosen, trusted=trusted)

    def stored_spec(self, pool: str | None = None, base_version: int = 0) -> dict[str, Any]:
        """The `jobs.spec` JSON of this job (`job_spec(...).stored()`)."""
        return self.job_spec(pool, base_version).stored()
