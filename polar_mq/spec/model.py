"""The job spec every stage reads: frozen, typed, versioned, with its defaults written once.

`jobs.schemas.JobCreate` is the door (strict types, unknown fields refused, plug-in names
resolved); it builds a `JobSpec` (`JobCreate.job_spec`), whose `stored()` dict is the `jobs.spec`
JSON. Readers never see that dict: `polar_mq.spec.upgrade.load_spec` turns any stored row, old ones
included, into a `JobSpec`. A default lives here and nowhere else, so a job that omitted a field and
the stage reading it agree by construction. The sub-specs are also the door's models (`JobCreate`
reuses them, adding the plug-in checks that need the registries), so the two cannot drift.

Free-form parts stay typed dicts: harness `options`/`env`, an evaluator's parameters — they go to
user code or plug-ins that own their shape. `sampling` is a `SamplingSpec` (`spec.sampling`): its
mapping kept as submitted (checked by `polar_mq.capability.sampling`), its values read typed.
Frozen means no attribute can be reassigned; those dicts must be treated as read-only too.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from polar_mq.spec.sampling import SamplingSpec

SPEC_VERSION = 2
"""Version 1: rows stored before the spec was versioned (no `spec_version`). 2: `spec_version`
stamped, every default written out (see `polar_mq.spec.upgrade`)."""
MAX_TASKS = 100_000
MAX_SAMPLES = 1024
MIN_PRIORITY = 0
MAX_PRIORITY = 9
DEFAULT_PRIORITY = 0
DEFAULT_POOL = "default"
MAX_MEMORY_MB = 1 << 24
"""16 TiB: any larger memory or file limit is a typo, and its byte count overflows a rlimit."""
MAX_LIMIT = 2**31 - 1
TitoMode = Literal["auto", "off"]
"""A job's token-in/token-out choice (`polar_mq.proxy.tito`, docs/tito.md): `auto` follows the
proxy's `proxy_tito`; `off` sends every call of the job's rollouts the chat way (the template's
own rendering of the history, e.g. earlier reasoning dropped)."""
TITO_MODES: tuple[TitoMode, ...] = ("auto", "off")


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


HARNESS_FIELDS: dict[str, frozenset[str]] = {
    "reference": frozenset({"type", "env"}),
    "command": frozenset({"type", "command", "env", "auxiliary_calls", "artifacts"}),
}
"""The fields each built-in harness type takes; any other type is a preset (`PRESET_FIELDS`)."""
PRESET_FIELDS = frozenset({"type", "version", "options", "env", "auto_install", "auxiliary_calls"})


def harness_fields_problem(harness_type: str, present: set[str]) -> str | None:
    """Why a harness spec of `harness_type` cannot carry the fields `present`, or None.

    A field another harness type takes would be silently ignored by this one (a `version` on a
    `command` harness): refused, naming what this type allows."""
    allowed = HARNESS_FIELDS.get(harness_type, PRESET_FIELDS)
    unknown = sorted(present - allowed)
    if not unknown:
        return None
    return (
        f"unknown key(s) {', '.join(map(repr, unknown))} in {harness_type!r} harness spec; "
        f"allowed: {', '.join(sorted(allowed))}"
    )


class HarnessSpec(SpecModel):
    """One spec shape for every harness type (the stored JSON is flat); `_fields_fit_type` keeps
    each type to its own fields, so a reader never meets a field its type ignores."""

    type: str = Field(
        "reference", description="command | reference | a preset (`polar-mq harness list`)"
    )
    command: str | None = Field(None, description="shell command; {instruction}, {task_file}…")
    env: dict[str, str] = Field(default_factory=dict)
    version: str | None = Field(None, description="preset version (default: the pinned one)")
    options: dict[str, Any] | None = Field(
        None, description="preset options: max_turns, extra_args, mcp_servers, skills, …"
    )
    auto_install: StrictBool | None = Field(
        None, description="install a missing preset on the node at prepare (under a lock)"
    )
    auxiliary_calls: list[dict[str, Any]] | None = Field(
        None, description="extra rules for side calls: system_contains, user_contains, "
        "max_tokens_at_most, no_tools (all set conditions must hold)",
    )  # fmt: skip
    artifacts: dict[str, str] | None = Field(
        None, description="command harness: artifact name -> workspace-relative file to keep"
    )

    @property
    def is_preset(self) -> bool:
        """Neither `command` nor `reference`: a preset, resolved by the harness registry."""
        return self.type not in HARNESS_FIELDS

    @model_validator(mode="after")
    def _fields_fit_type(self) -> HarnessSpec:
        present = {name for name in self.model_fields_set if getattr(self, name) is not None}
        problem = harness_fields_problem(self.type, present)
        if problem is not None:
            raise ValueError(problem)
        return self


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


class PrepareRecipe(SpecModel):
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


class EvaluationRuntimeSpec(SpecModel):
    """Grade in a fresh runtime (same kind, image, network and limits as the agent's).

    It is prepared with its own recipe while the agent runs; the agent's workspace is copied in
    before grading, and the recipe's files are written again on top (hidden tests stay hidden).
    """

    prepare: PrepareRecipe = Field(
        default_factory=PrepareRecipe, description="the grader's files and commands"
    )


class RuntimeSpec(SpecModel):
    kind: Literal["local", "bwrap", "docker"] = Field("local", description="local | bwrap | docker")
    image: str | None = Field(
        None, min_length=1, max_length=500, description="docker: an image present on the nodes"
    )
    network: Literal["host", "none", "proxy_only"] = Field(
        "host",
        description="bwrap/docker: host (the node's network), none (no network at all) or "
        "proxy_only (the proxy and nothing else; see docs/hardening.md); unset, a third-party "
        "preset under bwrap/docker gets proxy_only and anything else host",
    )
    memory_mb: int | None = Field(
        None, ge=16, le=MAX_MEMORY_MB, strict=True,
        description="local/bwrap: address space (RLIMIT_AS); docker: the container's memory",
    )  # fmt: skip
    cpu_seconds: int | None = Field(None, ge=1, le=MAX_LIMIT, strict=True)
    max_open_files: int | None = Field(None, ge=16, le=MAX_LIMIT, strict=True)
    file_size_mb: int | None = Field(
        None, ge=1, le=MAX_MEMORY_MB, strict=True,
        description="largest file a process of the runtime may write (RLIMIT_FSIZE; docker: the "
        "fsize ulimit): a per-file disk cap, not a quota on the workspace's total",
    )  # fmt: skip
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
    def _reuse_needs_warm(self) -> RuntimeSpec:
        if self.reuse and not self.warm:
            raise ValueError(
                "runtime.reuse needs runtime.warm: true (reuse returns it to the pool)"
            )
        return self


class TimeoutSpec(SpecModel):
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


class StopSpec(SpecModel):
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


class RetrySpec(SpecModel):
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


class StalenessSpec(SpecModel):
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


class StoredStaleness(StalenessSpec):
    """The stored staleness rule: the submitted one plus the policy version the job began at."""

    base_version: int = Field(0, ge=0, strict=True)


class JobSpec(SpecModel):
    """What every stage of a job reads (tasks, metadata and counts are stored apart)."""

    spec_version: int = SPEC_VERSION
    pool: str = DEFAULT_POOL
    priority: int = Field(DEFAULT_PRIORITY, ge=MIN_PRIORITY, le=MAX_PRIORITY, strict=True)
    harness: HarnessSpec = Field(default_factory=HarnessSpec)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    evaluator: str | dict[str, Any] = "completed"
    builder: str = "per_call"
    max_tokens_per_rollout: int | None = None
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    stop: StopSpec | None = None
    timeouts: TimeoutSpec = Field(default_factory=TimeoutSpec)
    retries: RetrySpec = Field(default_factory=RetrySpec)
    model: str | None = None
    staleness: StoredStaleness | None = None
    tito: TitoMode = "auto"

    @property
    def evaluator_name(self) -> str:
        """The evaluator's name, for logs and events (`?` for a dict without one)."""
        if isinstance(self.evaluator, str):
            return self.evaluator
        return str(self.evaluator.get("name", "?"))

    def stored(self) -> dict[str, Any]:
        """The `jobs.spec` JSON: every default written out, so a later default never changes
        what an old job meant, and `spec_version` stamped for `polar_mq.spec.upgrade`."""
        return self.model_dump(mode="json", exclude_none=True)
