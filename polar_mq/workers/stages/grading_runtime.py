"""A separate evaluation runtime: a fresh sandbox for grading, prewarmed while the agent runs.

Why: grading inside the agent's own sandbox lets whatever the agent left behind (a daemon that
rewrites files, a patched interpreter in its home) interfere with the grade, and any file the
grader needs (hidden tests) would have been visible to the agent. With `runtime.evaluation` set,
evaluate runs in a second runtime of the same kind, image and limits, prepared with the grader's
own recipe; only the agent's *workspace* is copied in, and the grader's files win over the
agent's. Its start and recipe run in a thread of the run-agent stage, so they overlap the agent
and cost the evaluate stage nothing.

Grading from the diff (the `tests` evaluator's default on a task with a `repo`,
`diff_grading_runtime`) goes further: the agent's work tree is diffed against the commit prepare
recorded, the agent's runtime is stopped (none of its processes is alive while it is graded), and
the grading runtime gets a pristine checkout of the task's repository, the job's recipe (or
`runtime.evaluation.prepare`), and then the agent's diff without the files the grader protects
(`polar_mq.swe.protect`). Nothing of the agent's workspace is copied.

The runtime's id is `<rollout hex>-<attempt>-eval`: any process on the node can re-attach to it,
and the janitor treats it like the agent runtime of the same attempt.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from polar_mq.config import Settings
from polar_mq.lifecycle.transitions import RolloutRef
from polar_mq.models import TerminationReason
from polar_mq.runtimes import Runtime
from polar_mq.runtimes.options import runtime_from_spec
from polar_mq.runtimes.recipe import RecipeFailed, apply_recipe
from polar_mq.runtimes.warm_pool import is_pooled
from polar_mq.spec import PrepareRecipe, RuntimeSpec
from polar_mq.swe import grading as saved_diff
from polar_mq.swe.apply import ApplyError, apply_patch
from polar_mq.swe.checkout import CheckoutError, checkout_repo
from polar_mq.swe.protect import FilteredPatch, PatchSplitError, filter_patch
from polar_mq.swe.spec import RepoSpec
from polar_mq.workers.stages.common import StageFailure, runtime_id_for

EVAL_SUFFIX = "-eval"


def grading_recipe(runtime_spec: RuntimeSpec) -> PrepareRecipe | None:
    """The grader's recipe when the job asks for a separate evaluation runtime, else None."""
    evaluation = runtime_spec.evaluation
    return None if evaluation is None else evaluation.prepare


def open_grading_runtime(
    settings: Settings, runtime_spec: RuntimeSpec, rollout: RolloutRef
) -> Runtime:
    """A handle on the rollout's evaluation runtime: the agent runtime's sandbox (kind, image,
    network, limits; not its recipe, which `prepare_grader` replaces), its own id."""
    runtime_id = runtime_id_for(rollout) + EVAL_SUFFIX
    return runtime_from_spec(runtime_spec, runtime_id, settings.runtime_root)


def is_ready(runtime: Runtime) -> bool:
    """Prewarmed: the workspace exists only once start and the recipe succeeded (see prewarm)."""
    return runtime.workdir.is_dir()


def prepare_grader(runtime: Runtime, recipe: PrepareRecipe, timeout_s: float) -> None:
    """Start the runtime and run the grader's recipe; a failure leaves no runtime behind."""
    try:
        runtime.start()
        for path, content in recipe.files.items():
            runtime.upload(content.encode(), path)
        for command in recipe.commands:
            result = runtime.exec(command, timeout=timeout_s)
            if not result.ok:
                raise StageFailure(
                    TerminationReason.RUNTIME_ERROR,
                    f"evaluation runtime: prepare command {command!r} failed "
                    f"(exit {result.exit_code}, timed out: {result.timed_out}): "
                    f"{result.stderr_tail[-1000:]}",
                )
    except BaseException:
        runtime.stop()
        raise


@dataclass
class Prewarm:
    """The grader's runtime being prepared in a thread while the agent runs."""

    runtime: Runtime
    recipe: PrepareRecipe
    timeout_s: float
    duration_s: float | None = None
    error: str | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> Prewarm:
        self._thread = threading.Thread(
            target=self._run, name=f"prewarm-{self.runtime.runtime_id}", daemon=True
        )
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        try:
            prepare_grader(self.runtime, self.recipe, self.timeout_s)
        except Exception as exc:  # evaluate tries again and fails the rollout with the reason
            self.error = str(exc)[-500:]
        self.duration_s = round(time.monotonic() - started, 4)

    def join(self) -> dict[str, Any]:
        """Wait for the prewarm (the agent has exited); what the run-agent event records."""
        waited = time.monotonic()
        if self._thread is not None:
            self._thread.join()
        return {
            "eval_prewarm_s": self.duration_s,
            "eval_prewarm_waited_s": round(time.monotonic() - waited, 4),
            **({"eval_prewarm_error": self.error} if self.error else {}),
        }


def start_prewarm(
    settings: Settings, runtime_spec: RuntimeSpec, rollout: RolloutRef, timeout_s: float
) -> Prewarm | None:
    """Begin preparing the evaluation runtime, when the job asks for one."""
    recipe = grading_recipe(runtime_spec)
    if recipe is None:
        return None
    runtime = open_grading_runtime(settings, runtime_spec, rollout)
    return Prewarm(runtime, recipe, timeout_s).start()


def grading_runtime(
    settings: Settings,
    runtime_spec: RuntimeSpec,
    rollout: RolloutRef,
    agent_runtime: Runtime,
    timeout_s: float,
) -> tuple[Runtime, dict[str, Any]]:
    """The runtime to grade in, holding the agent's workspace; and what to record about it.

    Without `runtime.evaluation` that is the agent's own runtime. Otherwise the prewarmed one
    (prepared here if the prewarm did not happen or failed), with the agent's workspace copied in
    and the grader's recipe files written again on top, so the agent cannot replace them.
    """
    recipe = grading_recipe(runtime_spec)
    if recipe is None:
        return agent_runtime, {}
    runtime = open_grading_runtime(settings, runtime_spec, rollout)
    prewarmed = is_ready(runtime)
    started = time.monotonic()
    if not prewarmed:
        prepare_grader(runtime, recipe, timeout_s)
    prepared_s = time.monotonic() - started
    if agent_runtime.workdir.is_dir():
        shutil.copytree(
            agent_runtime.workdir, runtime.workdir, symlinks=True, dirs_exist_ok=True,
            ignore=_special_files,
        )  # fmt: skip
    for path, content in recipe.files.items():
        runtime.upload(content.encode(), path)
    runtime.hand_over()  # the copies are the worker's; the grader's commands run as the agent
    return runtime, {
        "eval_runtime_id": runtime.runtime_id,
        "eval_runtime_prewarmed": prewarmed,
        "eval_runtime_prepare_s": round(prepared_s, 4),
        "eval_runtime_copy_s": round(time.monotonic() - started - prepared_s, 4),
    }


def _special_files(directory: str, names: list[str]) -> set[str]:
    """Skip FIFOs, sockets and devices: copying a FIFO the agent left would block evaluate."""
    skipped = set()
    for name in names:
        mode = os.lstat(os.path.join(directory, name)).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            skipped.add(name)
    return skipped


def release_grading_runtime(
    settings: Settings, runtime_spec: RuntimeSpec, rollout: RolloutRef
) -> None:
    """Stop the evaluation runtime, if the job has one or the rollout was graded from its diff
    (idempotent like every `stop`), and forget the saved diff."""
    graded_from_diff = saved_diff.forget(settings.runtime_root, grading_key(rollout))
    if graded_from_diff or grading_recipe(runtime_spec) is not None:
        open_grading_runtime(settings, runtime_spec, rollout).stop()


def grading_key(rollout: RolloutRef) -> str:
    """The name the rollout's saved diff is kept under: its evaluation runtime's id."""
    return runtime_id_for(rollout) + EVAL_SUFFIX


class PatchRefused(RuntimeError):
    """The agent's diff does not apply to the pristine commit (its objects or base were forged):
    the agent's doing, scored 0."""


@dataclass
class DiffGrading:
    """The runtime holding pristine repository + accepted diff, and what to record about it."""

    runtime: Runtime
    diff: saved_diff.AgentDiff
    filtered: FilteredPatch
    stage_detail: dict[str, Any]


def stop_agent(agent_runtime: Runtime) -> None:
    """Kill every process of the agent's runtime before anything is graded: a pooled one is
    reset (the pool recycles or destroys it on release), any other stopped."""
    if is_pooled(agent_runtime.runtime_id):
        agent_runtime.reset()
    else:
        agent_runtime.stop()


def diff_grading_runtime(
    settings: Settings,
    runtime_spec: RuntimeSpec,
    rollout: RolloutRef,
    agent_runtime: Runtime,
    repo: RepoSpec,
    base: str,
    protected: list[str],
    timeout_s: float,
) -> DiffGrading:
    """Take (or reload) the agent's diff, stop the agent, and build the grading runtime.

    Raises `saved_diff.DiffUnavailable` or `StageFailure` for the platform's failures and
    `PatchRefused` when the accepted diff does not apply."""
    started = time.monotonic()
    key = grading_key(rollout)
    diff = saved_diff.load_saved(settings.runtime_root, key, base)
    reloaded = diff is not None
    if diff is None:
        diff = saved_diff.take_diff(agent_runtime.workdir, repo, base, timeout_s)
        saved_diff.save(settings.runtime_root, key, diff)
    stop_agent(agent_runtime)
    diffed = time.monotonic()
    runtime = open_grading_runtime(settings, runtime_spec, rollout)
    runtime.stop()  # a prewarmed one ran its recipe without the repository; a half-made one
    try:
        filtered = filter_patch(diff.patch, diff.files, protected)
        runtime.start()
        checkout_repo(saved_diff.at_commit(repo, base), runtime.workdir, timeout_s)
        runtime.hand_over()
        recipe = grading_recipe(runtime_spec) or runtime_spec.prepare
        apply_recipe(runtime, recipe, timeout_s)  # before the agent's code: SWE-bench's order
        apply_patch(runtime.workdir, filtered.patch, timeout_s)
        runtime.hand_over()  # the applied files are the worker's until now
    except ApplyError as exc:
        runtime.stop()
        raise PatchRefused(str(exc)) from exc
    except PatchSplitError as exc:
        runtime.stop()
        raise saved_diff.DiffUnavailable(f"cannot split the agent's diff: {exc}") from exc
    except (CheckoutError, RecipeFailed) as exc:
        runtime.stop()
        raise StageFailure(
            TerminationReason.RUNTIME_ERROR, f"grading runtime: {str(exc)[-1000:]}"
        ) from exc
    except BaseException:
        runtime.stop()
        raise
    return DiffGrading(
        runtime,
        diff,
        filtered,
        {
            "eval_runtime_id": runtime.runtime_id,
            "eval_mode": "diff",
            "eval_diff_reloaded": reloaded,
            "eval_diff_s": round(diffed - started, 4),
            "eval_runtime_prepare_s": round(time.monotonic() - diffed, 4),
        },
    )
