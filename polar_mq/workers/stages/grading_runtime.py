"""A separate evaluation runtime: a fresh sandbox for grading, prewarmed while the agent runs.

Why: grading inside the agent's own sandbox lets whatever the agent left behind (a daemon that
rewrites files, a patched interpreter in its home) interfere with the grade, and any file the
grader needs (hidden tests) would have been visible to the agent. With `runtime.evaluation` set,
evaluate runs in a second runtime of the same kind, image and limits, prepared with the grader's
own recipe; only the agent's *workspace* is copied in, and the grader's files win over the
agent's. Its start and recipe run in a thread of the run-agent stage, so they overlap the agent
and cost the evaluate stage nothing.

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
from polar_mq.spec import PrepareRecipe, RuntimeSpec
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
    """Stop the evaluation runtime, if the job has one (idempotent like every `stop`)."""
    if grading_recipe(runtime_spec) is not None:
        open_grading_runtime(settings, runtime_spec, rollout).stop()
