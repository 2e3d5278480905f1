"""Stage 1, prepare runtime: start the rollout's sandbox, write the task file, run the recipe.

Runs on whichever node of the pool takes the message; the node it ran on is recorded so run agent
and evaluate are routed to the node that holds the runtime.
"""

from __future__ import annotations

import orjson

from polar_mq.models import TerminationReason
from polar_mq.workers.context import WorkerContext
from polar_mq.workers.stages.common import StageFailure, StageOutcome, open_runtime
from polar_mq.workers.transitions import Claimed

TASK_FILE = "task.json"


def run(ctx: WorkerContext, claimed: Claimed) -> StageOutcome:
    spec = claimed.spec
    runtime_spec = spec.get("runtime", {})
    timeout = float(spec.get("timeouts", {}).get("prepare_s", 300.0))
    runtime = open_runtime(ctx.settings, runtime_spec, claimed.rollout)
    runtime.start()
    runtime.upload(orjson.dumps(claimed.instance, option=orjson.OPT_INDENT_2), TASK_FILE)
    recipe = runtime_spec.get("prepare", {})
    for path, content in recipe.get("files", {}).items():
        runtime.upload(content.encode(), path)
    for command in recipe.get("commands", []):
        result = runtime.exec(command, timeout=timeout)
        if result.exit_code != 0:
            raise StageFailure(
                TerminationReason.RUNTIME_ERROR,
                f"prepare command {command!r} failed (exit {result.exit_code}, "
                f"timed out: {result.timed_out}): {result.stderr_tail[-1000:]}",
            )
    return StageOutcome(
        values={"node": ctx.settings.node_name, "runtime_id": runtime.runtime_id},
        detail={"node": ctx.settings.node_name, "runtime_id": runtime.runtime_id},
    )
