"""Worker planning: one Celery process per stage with its own queue and concurrency."""

from __future__ import annotations

import pytest

from polar_mq.config import Settings
from polar_mq.workers.launcher import parse_concurrency, parse_stages, plan_workers
from polar_mq.workers.routing import Stage


def test_plan_routes_stages_to_pool_and_node_queues() -> None:
    settings = Settings(queue_prefix="q", pool="gpu", node_name="n7")
    plan = plan_workers(
        settings, parse_stages("prepare,run_agent,build,evaluate"),
        parse_concurrency("run_agent=16"), "threads",
    )  # fmt: skip
    queues = {w.stage: w.queue for w in plan}
    assert queues == {
        Stage.PREPARE: "q.prepare.gpu",
        Stage.RUN_AGENT: "q.run_agent.n7",
        Stage.BUILD: "q.build.gpu",
        Stage.EVALUATE: "q.evaluate.n7",
    }
    run_agent = next(w for w in plan if w.stage is Stage.RUN_AGENT)
    assert run_agent.concurrency == 16
    assert "-Q" in run_agent.argv() and "q.run_agent.n7" in run_agent.argv()


@pytest.mark.parametrize("bad", ["run_agent", "run_agent=0", "nope=3", "run_agent=x"])
def test_bad_concurrency_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        parse_concurrency(bad)


def test_unknown_stage() -> None:
    with pytest.raises(ValueError, match="unknown stage"):
        parse_stages("prepare,cook")


def test_settings_refuse_visibility_shorter_than_agent_timeout() -> None:
    with pytest.raises(ValueError, match="VISIBILITY_TIMEOUT"):
        Settings(visibility_timeout_s=100, max_agent_timeout_s=200)
