"""What the stage modules share: their failure types and the runtime handle (their result types
are in `outcomes`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from tenacity import RetryCallState, Retrying, stop_after_delay, wait_exponential

from polar_mq.config import Settings
from polar_mq.lifecycle.transitions import RolloutRef
from polar_mq.runtimes import Runtime
from polar_mq.runtimes.options import runtime_from_spec
from polar_mq.runtimes.warm_pool import WarmPool, is_pooled
from polar_mq.spec import RuntimeSpec
from polar_mq.workers.context import WorkerContext


class StageFailure(Exception):
    """An infrastructure failure with its termination reason; the rollout fails unscored."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class StageRestart(StageFailure):
    """A transient infrastructure failure of the agent stage: start the rollout over (a new
    attempt, within `retries.max_attempts`), never score this one."""


def runtime_id_for(rollout: RolloutRef) -> str:
    """Deterministic per attempt, so any process on the node can re-attach or clean it up."""
    return f"{rollout.id.hex}-{rollout.attempt}"


def pool_owner(rollout: RolloutRef) -> str:
    """How the warm pool names the rollout attempt holding a runtime (the janitor's format)."""
    return runtime_id_for(rollout)


def open_runtime(
    settings: Settings,
    runtime_spec: RuntimeSpec,
    rollout: RolloutRef,
    ro_binds: Sequence[str] = (),
) -> Runtime:
    """A handle on the rollout's runtime (any kind), built from the job's runtime spec.

    The runtime the rollout actually got is stored on it by prepare (a warm one has a pool id);
    rollouts prepared before that have the deterministic id. `ro_binds` matter to the one that
    starts it (prepare): a started sandbox keeps what it was started with.
    """
    runtime_id = rollout.runtime_id or runtime_id_for(rollout)
    return runtime_from_spec(runtime_spec, runtime_id, settings.runtime_root, ro_binds)


def release_runtime(
    settings: Settings,
    pool: WarmPool,
    runtime_spec: RuntimeSpec,
    rollout: RolloutRef,
    *,
    reusable: bool = False,
) -> dict[str, Any]:
    """Give back the rollout's runtime: recycle it into the warm pool or destroy it.

    The one place a rollout's runtime ends. Recycled only when the job asks for `reuse` and the
    caller says the rollout ended normally (`reusable`); a failed attempt's runtime is always
    destroyed. A pooled runtime taken by a prepare that failed before storing its id is found by
    its pool marker. Returns the detail of the `runtime_released` event (action and seconds).
    """
    runtime_id = rollout.runtime_id or pool.taken_by(pool_owner(rollout))
    if is_pooled(runtime_id):
        assert runtime_id is not None
        handle = pool.handle(runtime_spec, runtime_id)
        reuse = reusable and runtime_spec.reuse
        return pool.release(handle, pool_owner(rollout), reuse)
    runtime = open_runtime(settings, runtime_spec, rollout)
    started = time.monotonic()
    runtime.stop()
    return {
        "runtime_id": runtime.runtime_id,
        "action": "destroyed",
        "teardown_s": round(time.monotonic() - started, 4),
    }


FLUSH_RETRY_S = 20.0


def flush_proxy(ctx: WorkerContext, give_up: Callable[[], bool] = lambda: False) -> dict[str, Any]:
    """Wait until the proxy stored every call it answered; its answer has `written` and
    `started_at` (the run-agent stage after the agent, evaluate after a judge).

    Retried for a while: a proxy restarting under a supervisor is back within seconds. Not once
    `give_up()` says the answer no longer matters (the stage's lease was lost: its result is
    discarded), so a cancelled rollout's stage does not wait out a proxy that is gone too."""
    headers = {}
    if ctx.settings.proxy_admin_token:
        headers["Authorization"] = f"Bearer {ctx.settings.proxy_admin_token}"
    out_of_time = stop_after_delay(FLUSH_RETRY_S)

    def stop(state: RetryCallState) -> bool:
        return give_up() or out_of_time(state)

    retrying = Retrying(
        stop=stop,
        wait=wait_exponential(multiplier=0.2, max=3),
        reraise=True,
    )
    for attempt in retrying:
        with attempt:
            response = ctx.http.post(f"{ctx.settings.proxy_base_url}/admin/flush", headers=headers)
            response.raise_for_status()
            return dict(response.json())
    raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover
