"""Jobs with `runtime: {warm: true, reuse: true}` through real worker processes and a real refiller.

Per runtime kind (local, docker), two jobs with the same sandbox spec, one after the other: the
second one's rollouts all take warm runtimes (recycled from the first job or built by the
refiller), the recipe runs once per runtime and never per rollout, start/recipe/reset timings are
on every rollout, and once the refiller stops nothing is left: no runtime directory, no process,
no container.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar_mq.client import Client
from polar_mq.infra.ports import free_port
from polar_mq.lifecycle.stages import Stage
from polar_mq.runtimes.janitor import present_runtimes
from polar_mq.runtimes.warm_pool import WarmPool, is_pooled
from polar_mq.stack.devstack import LocalStack
from polar_mq.workers.janitor import local_runtime_ids
from tests.e2e.stack import e2e_settings
from tests.runtimes.runtime_backends import TEST_IMAGE, skip_reason

pytestmark = pytest.mark.e2e

AGENT_SLOTS = 2
RECIPE = {
    "files": {"fixture.txt": "42"},
    # in home: the baseline keeps this one line, a second run of the recipe would add another
    "commands": ['echo once >> "$HOME/recipe-runs.log" && sleep 0.3'],
}
# the agent proves the recipe's file is there and leaves dirt a recycle must clean up
HARNESS = {
    "type": "command",
    "command": "test -f fixture.txt && test ! -f dirt.txt && echo dirt > dirt.txt && "
    "cat fixture.txt > answer.txt",
}


@pytest.fixture(scope="module")
def warm_stack(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("e2e-warm")
    upstream = free_port()
    settings = e2e_settings(
        pg_url, tmp, upstream_url=f"http://127.0.0.1:{upstream}", served_model="fake-model",
        warm_pool_refill_interval_s=0.2,
    )  # fmt: skip
    with LocalStack(settings, tmp / "logs") as stack:
        stack.fake_upstream(upstream)
        stack.proxy()
        stack.workers(
            concurrency={Stage.RUN_AGENT: AGENT_SLOTS, Stage.PREPARE: 2}, one_supervisor=True
        )
        stack.api()
        yield stack


def _pool_settled(pool: WarmPool, timeout: float = 30) -> None:
    """Wait until no runtime is being recycled or built (releases follow the last commit)."""
    deadline = time.monotonic() + timeout
    while any(m.state != "idle" for m in pool.markers()):
        assert time.monotonic() < deadline, pool.markers()
        time.sleep(0.1)


@pytest.mark.parametrize("kind", ["local", "docker"])
def test_warm_jobs_take_recycled_runtimes_and_leave_nothing(
    warm_stack: LocalStack, kind: str
) -> None:
    reason = skip_reason(kind)
    if reason:
        pytest.skip(reason)
    runtime: dict[str, Any] = {"kind": kind, "warm": True, "reuse": True, "prepare": RECIPE}
    if kind == "docker":
        runtime["image"] = TEST_IMAGE
    s = warm_stack.settings
    client = Client(f"http://{s.api_host}:{s.api_port}")
    refiller = warm_stack.warm_pool(agent_slots=AGENT_SLOTS)
    pool = WarmPool(s.runtime_root)
    jobs = []
    for _ in range(2):
        job = client.submit(
            [{"instruction": "answer", "answer": "42"}], samples_per_task=4, harness=HARNESS,
            runtime=runtime, evaluator="exact_match",
        )  # fmt: skip
        status = client.wait(str(job.job_id), progress=False, timeout=120)
        assert status["by_status"] == {"completed": 4}, status
        jobs.append(job)
        _pool_settled(pool)

    details = [client.rollout(str(r)) for job in jobs for r in job.rollout_ids]
    assert all(d["reward"] == 1.0 for d in details)
    runtime_ids = {d["runtime_id"] for d in details}
    assert all(is_pooled(r) for r in runtime_ids)
    for d in details:
        timing = d["runtime"]
        assert timing["source"] in ("pool", "cold")
        assert timing["start_s"] >= 0 and timing["recipe_s"] >= 0
        assert timing["action"] in ("recycled", "destroyed")
        assert timing.get("reset_s", timing.get("teardown_s", -1)) >= 0
    second = [d["runtime"] for d in details[4:]]
    assert [t["source"] for t in second] == ["pool"] * 4, second
    assert all(t["warm"] and t["recipe_s"] == 0 for t in second)

    # the recipe ran once per runtime, not once per rollout
    idle = {m.runtime_id for m in pool.markers("idle")}
    assert idle and idle <= runtime_ids | {m.runtime_id for m in pool.markers()}
    runs = {
        rid: len((s.runtime_root / rid / "home" / "recipe-runs.log").read_text().splitlines())
        for rid in idle
    }
    assert set(runs.values()) == {1}, runs
    assert len(runtime_ids) < len(details)
    assert not [p for rid in idle for p in Path(s.runtime_root / rid / "workspace").glob("dirt*")]

    refiller.stop()  # a graceful stop empties the pool
    assert local_runtime_ids(s.runtime_root) == set()
    assert present_runtimes(s.runtime_root) == {}  # no directory, container or cgroup
    assert not [p for p in s.runtime_root.iterdir() if p.name not in (".warm", "logs")]
    assert pool.markers() == []
