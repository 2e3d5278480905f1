"""The job submission schema: everything a trainer can ask for, validated before anything is stored.

Unknown fields are refused (a typo in a spec must not silently fall back to a default), numbers
and booleans are strict (`"5"` or `true` is not a count: a spec that says so has a bug), and
harness, evaluator and builder names are resolved at submit time so a bad job is a 4xx, never a
fleet of failing rollouts. `prepare.files` keys must stay inside the workspace (relative, no `..`).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from polar_mq.evaluators.registry import validate_evaluator_spec
from polar_mq.harnesses import get_harness
from polar_mq.lifecycle.priority import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from polar_mq.runtimes.options import check_runtime_options
from polar_mq.sampling import validate_sampling
from polar_mq.swe.spec import TaskSpecError, validate_task_fields
from polar_mq.trajectories.registry import validate_builder_name

MAX_TASKS = 100_000
MAX_SAMPLES = 1024


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HarnessSpec(StrictModel):
    type: str = Field(
        "reference", description="command | reference | a preset (`polar-mq harness list`)"
    )
    command: str | None = Field(None, description="shell command; {instruction}, {task_file}…")
    env: dict[str, str] = Field(default_factory=dict)
    version: str | None = Field(None, description="preset version (default: the pinned one)")
    options: dict[str, Any] | None = Field(
        None, description="preset options: max_turns, extra_args, mcp_servers, skills, …"
    )
    auto_install: bool | None = Field(
        None, description="install a missing preset on the node at prepare (under a lock)"
    )
    auxiliary_calls: list[dict[str, Any]] | None = Field(
        None, description="extra rules for side calls: system_contains, user_contains, "
        "max_tokens_at_most, no_tools (all set conditions must hold)",
    )  # fmt: skip
    artifacts: dict[str, str] | None = Field(
        None, description="command harness: artifact name -> workspace-relative file to keep"
    )

    @model_validator(mode="after")
    def _resolvable(self) -> HarnessSpec:
        get_harness(self.model_dump(exclude_none=True))
        return self


class PrepareRecipe(StrictModel):
    files: dict[str, str] = Field(
        default_factory=dict,
        description="path in workspace (relative, no '..') → content",
    )
    commands: list[str] = Field(default_factory=list, description="run in order; must exit 0")

    @field_validator("files")
    @classmethod
    def _inside_workspace(cls, files: dict[str, str]) -> dict[str, str]:
        """Refused now, not after the prepare stage's retries: the runtime would refuse it too."""
        for path in files:
            problem = workspace_path_problem(path)
            if problem is not None:
                raise ValueError(f"file {path!r}: {problem}")
        return files


def workspace_path_problem(path: str) -> str | None:
    """Why `path` cannot name a file inside the workspace, or None when it can."""
    if not path.strip():
        return "empty path"
    if "\x00" in path:
        return "NUL character in path"
    pure = PurePosixPath(path)
    if pure.is_absolute() or path.startswith("~"):
        return "must be relative to the workspace, not absolute"
    if ".." in pure.parts:
        return "must stay inside the workspace ('..' is not allowed)"
    return None


class EvaluationRuntimeSpec(StrictModel):
    """Grade in a fresh runtime (same kind, image, network and limits as the agent's).

    It is prepared with its own recipe while the agent runs; the agent's workspace is copied in
    before grading, and the recipe's files are written again on top (hidden tests stay hidden).
    """

    prepare: PrepareRecipe = Field(
        default_factory=PrepareRecipe, description="the grader's files and commands"
    )


class RuntimeSpec(StrictModel):
    kind: Literal["local", "bwrap", "docker"] = Field("local", description="local | bwrap | docker")
    image: str | None = Field(
        None, min_length=1, max_length=500, description="docker: an image present on the nodes"
    )
    network: Literal["host", "none", "proxy_only"] = Field(
        "host",
        description="bwrap/docker: host (the node's network), none (no network at all) or, bwrap "
        "only, proxy_only (the proxy and nothing else; see docs/hardening.md)",
    )
    memory_mb: int | None = Field(None, ge=16, strict=True)
    cpu_seconds: int | None = Field(None, ge=1, strict=True)
    max_open_files: int | None = Field(None, ge=16, strict=True)
    cpus: float | None = Field(
        None, gt=0, le=1024, strict=True, description="docker: CPU quota in cores"
    )
    pids: int | None = Field(
        None, ge=8, le=1_000_000, strict=True, description="bwrap/docker: max processes"
    )
    python: str | None = Field(
        None,
        min_length=1,
        max_length=500,
        description="docker: the image's interpreter for the reference agent (default python3)",
    )
    prepare: PrepareRecipe = Field(default_factory=PrepareRecipe)
    evaluation: EvaluationRuntimeSpec | None = Field(
        None, description="set to grade in a separate, fresh runtime (prewarmed during the agent)"
    )
    warm: StrictBool = Field(
        False,
        description="take a prepared runtime from the node's warm pool (recipe already applied; "
        "it must not depend on the task: the task file is written at take time)",
    )
    reuse: StrictBool = Field(
        False, description="warm only: after evaluate, reset the runtime and return it to the pool"
    )

    @model_validator(mode="after")
    def _options_fit_kind(self) -> RuntimeSpec:
        check_runtime_options(self.model_dump(exclude={"prepare", "evaluation"}))
        if self.reuse and not self.warm:
            raise ValueError(
                "runtime.reuse needs runtime.warm: true (reuse returns it to the pool)"
            )
        return self


class TimeoutSpec(StrictModel):
    agent_s: float = Field(600.0, gt=0, strict=True, description="wall clock for run agent")
    inactivity_s: float | None = Field(
        None, gt=0, strict=True, description="kill after N s without output"
    )
    prepare_s: float = Field(300.0, gt=0, strict=True)
    evaluate_s: float = Field(300.0, gt=0, strict=True)
    rollout_s: float | None = Field(
        None,
        gt=0,
        strict=True,
        description="wall clock for the whole rollout, counted from prepare",
    )


class StopSpec(StrictModel):
    """Over-provisioning: ask for more rollouts than needed and stop once enough are usable.

    Usable = ended with an agent outcome (completed, agent_error, timeout, max_turns,
    token_budget) and scored; infrastructure failures never count.
    """

    usable_samples_per_group: int | None = Field(
        None,
        ge=1,
        strict=True,
        le=MAX_SAMPLES,
        description="a group is complete as soon as this many of its samples ended usable",
    )
    groups: int | None = Field(
        None,
        ge=1,
        strict=True,
        le=MAX_TASKS,
        description="stop the job once this many groups are complete: cancel the other groups",
    )
    stragglers: Literal["cancel", "withhold"] = Field(
        "cancel",
        description="unfinished samples of a group completed early: cancel them, or let them "
        "run but keep them out of the group (listed with straggler: true, never counted)",
    )

    @model_validator(mode="after")
    def _one_rule(self) -> StopSpec:
        if self.usable_samples_per_group is None and self.groups is None:
            raise ValueError("stop needs usable_samples_per_group, groups, or both")
        return self


class RetrySpec(StrictModel):
    """How often polar_mq retries infrastructure failures before giving a rollout up."""

    max_attempts: int = Field(
        3,
        ge=1,
        le=20,
        strict=True,
        description="runs of a rollout from prepare (a lost worker costs one)",
    )
    stage_retries: int = Field(
        3,
        ge=0,
        le=20,
        strict=True,
        description="in-place retries of a stage that raised unexpectedly",
    )


class StalenessSpec(StrictModel):
    """Asynchronous RL: how far generation may run ahead of the trainer (in policy versions).

    Rollouts are admitted group by group while `admitted groups <= (max_staleness + versions since
    submit + 1) * batch_size`, so at most `max_staleness` training steps' worth of groups are
    generated ahead of the weights that will train on them. A group whose oldest token is more
    than `max_staleness` versions behind the current policy is never streamed to the trainer.
    """

    max_staleness: int = Field(
        ..., ge=0, le=1000, strict=True, description="versions a sample may lag"
    )
    batch_size: int = Field(
        ...,
        ge=1,
        le=MAX_TASKS,
        strict=True,
        description="groups the trainer consumes per training step",
    )
    on_stale: Literal["withhold", "drop"] = Field(
        "withhold",
        description="withhold: keep stale groups out of the stream but in the results (off-policy "
        "use); drop: also cancel their unfinished rollouts (reason stale) to free capacity",
    )


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
    evaluator: str | dict[str, Any] = Field("completed", description="name, {name, …}, or path")
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
    def _evaluator_known(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        validate_evaluator_spec(value)
        return value

    @field_validator("builder")
    @classmethod
    def _builder_known(cls, value: str) -> str:
        validate_builder_name(value)
        return value

    def stored_spec(self) -> dict[str, Any]:
        """The part of the job every stage reads (tasks and metadata are stored apart).

        The default priority is left out, so a job stored before priorities existed and its
        idempotent resubmission still have the same spec (readers use `job_priority`).
        """
        spec = self.model_dump(
            mode="json",
            exclude_none=True,
            exclude={"tasks", "metadata", "idempotency_key", "samples_per_task"},
        )
        if spec.get("priority") == DEFAULT_PRIORITY:
            del spec["priority"]
        return spec
