"""Stage 1, prepare runtime: get the rollout's sandbox ready, write the task file.

Runs on whichever node of the pool takes the message; the node it ran on and the runtime it got
are recorded so run agent and evaluate are routed to that node and open that runtime.

Two ways to a runtime:
- a job with `runtime.warm` takes one from the node's warm pool (recipe already applied, checked
  alive on take), or builds a new pooled one when the pool has none for its spec (a cold start,
  recyclable afterwards like any pooled runtime). The recipe must not depend on the task: it ran
  before the task was known, so the task file is written last.
- any other job starts a fresh runtime with the rollout's deterministic id, writes the task file
  and runs the recipe, as before.

A task with a `repo` gets its repository checked out into the workspace first (cold: before the
recipe, so the recipe can install it; warm: at take time, after the task-independent recipe). The
task file the agent reads never holds the hidden tests or the repository's node path
(`polar_mq.swe.spec.agent_task`). A repository that cannot be checked out fails the rollout with
`runtime_error` and the reason.

The `finished` event's `runtime` detail records where the runtime came from and how long its start
and recipe took (0 for a warm one: that is the point of the pool), and `repo` the commit checked
out.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from polar_mq.harnesses.presets.setup import (
    HarnessMissing,
    check_agent_reaches,
    check_in_image,
    ensure_installed,
    sandbox_binds,
)
from polar_mq.lifecycle.transitions import Claimed
from polar_mq.models import TerminationReason
from polar_mq.runtimes import Runtime
from polar_mq.runtimes.recipe import RecipeFailed, apply_recipe
from polar_mq.spec import TaskInstance
from polar_mq.swe.checkout import CheckoutError, checkout_repo
from polar_mq.swe.spec import TaskSpecError, agent_task, parse_repo
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.stages.common import (
    StageFailure,
    open_runtime,
    pool_owner,
    release_runtime,
)
from polar_mq.workers.stages.outcomes import Prepared

TASK_FILE = "task.json"


def _install_task(runtime: Runtime, instance: TaskInstance, timeout: float) -> dict[str, Any]:
    """Check out the task's repository, if it has one, then write the agent's task file."""
    detail: dict[str, Any] = {}
    commit = None
    if instance.repo is not None:
        done = checkout_repo(parse_repo(instance.repo), runtime.workdir, timeout)
        commit = done.commit
        detail["repo"] = {"commit": done.commit, "source": done.source, "seconds": done.seconds}
    task = agent_task(instance.stored, commit)
    runtime.upload(orjson.dumps(task, option=orjson.OPT_INDENT_2), TASK_FILE)
    runtime.hand_over()  # the checkout is the worker's until now; the agent (not root) edits it
    return detail


def _cold(ctx: WorkerContext, claimed: Claimed, timeout: float) -> tuple[Runtime, dict[str, Any]]:
    spec = claimed.spec
    binds = sandbox_binds(spec.runtime, spec.harness, ctx.settings.harness_root)
    runtime = open_runtime(ctx.settings, spec.runtime, claimed.rollout, binds)
    t0 = time.monotonic()
    runtime.start()
    t1 = time.monotonic()
    task = _install_task(runtime, claimed.instance, timeout)
    recipe_s = apply_recipe(runtime, spec.runtime.prepare, timeout)
    detail = {"source": "cold", "warm": False, "start_s": round(t1 - t0, 4)}
    return runtime, {**detail, "recipe_s": round(recipe_s, 4), **task}


def _warm(ctx: WorkerContext, claimed: Claimed, timeout: float) -> tuple[Runtime, dict[str, Any]]:
    spec = claimed.spec
    binds = sandbox_binds(spec.runtime, spec.harness, ctx.settings.harness_root)
    owner = pool_owner(claimed.rollout)
    got = ctx.warm_pool.take(spec.runtime, owner, binds) or ctx.warm_pool.cold(
        spec.runtime, owner, timeout, binds
    )
    try:
        task = _install_task(got.runtime, claimed.instance, timeout)
    except BaseException:
        release_runtime(ctx.settings, ctx.warm_pool, claimed.spec.runtime, claimed.rollout)
        raise
    return got.runtime, {**got.detail, **task}


def run(ctx: WorkerContext, claimed: Claimed) -> Prepared:
    spec = claimed.spec
    timeout = spec.timeouts.prepare_s
    harness_spec = spec.harness
    docker = spec.runtime.kind == "docker"
    try:  # a preset harness must be installed on this node before a runtime is spent on it
        if not docker:
            ensure_installed(ctx.settings.harness_root, harness_spec, ctx.settings.node_name)
        get = _warm if spec.runtime.warm else _cold
        runtime, detail = get(ctx, claimed, timeout)
        if docker:  # ... or baked into the image (the runtime is released by the runner)
            check_in_image(runtime, harness_spec, str(spec.runtime.image))
        else:  # ... and within the agent user's reach
            check_agent_reaches(runtime, harness_spec, ctx.settings.harness_root)
    except (RecipeFailed, HarnessMissing, CheckoutError, TaskSpecError) as exc:
        raise StageFailure(TerminationReason.RUNTIME_ERROR, str(exc)) from exc
    return Prepared(node=ctx.settings.node_name, runtime_id=runtime.runtime_id, runtime=detail)
