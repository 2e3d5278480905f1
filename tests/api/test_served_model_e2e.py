"""The README's first job on a stack started by hand, without `POLAR_MQ_SERVED_MODEL`.

Real API, proxy, stage workers and the fake vLLM (serving one model, `fake-model`) on PostgreSQL.
Without a configured served model the agent was told `default`, the proxy passed that name on and
the engine answered 404 to every call: each rollout failed after its retries, minutes later. The
API now reads the engine's `/v1/models` at submit: a job that names no model gets the one served,
and a name the engine does not serve is a 422 naming what it does serve.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from polar_mq.client import PolarMQError
from polar_mq.infra.ports import free_port
from polar_mq.stack.devstack import LocalStack
from tests.e2e.stack import client_of, e2e_settings

pytestmark = pytest.mark.e2e

TASKS = [{"instruction": "What is 6*7?", "answer": "42"}]


@pytest.fixture(scope="module")
def stack(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("unnamed-model")
    upstream = free_port()
    settings = e2e_settings(pg_url, tmp, upstream_url=f"http://127.0.0.1:{upstream}")
    assert settings.served_model is None  # as a stack started by hand
    with LocalStack(settings, tmp / "logs") as local:
        local.fake_upstream(upstream, wait=False)
        local.proxy(wait=False)
        local.workers(one_supervisor=True)
        local.api(wait=False)
        local.wait_ready()
        yield local


def test_the_readme_snippet_runs_as_written(
    stack: LocalStack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    client = client_of(stack)
    job = client.submit(
        [{"instruction": "What is 6*7?", "answer": "42"}],
        samples_per_task=8, harness={"type": "reference"}, evaluator="exact_match",
    )  # fmt: skip
    status = client.wait(job.job_id, progress=False, timeout=300)
    assert status["by_status"] == {"completed": 8}, status
    (group,) = client.iter_groups(job.job_id, include_trajectories=True, advantages="grpo")
    assert [s["reward"] for s in group["samples"]] == [1.0] * 8
    assert all(s["trajectories"] and s["advantage"] is not None for s in group["samples"])
    out = tmp_path_factory.mktemp("export") / "job.parquet"
    client.export(job.job_id, str(out))
    assert out.stat().st_size > 0


def test_a_model_the_engine_does_not_serve_is_refused_at_submit(stack: LocalStack) -> None:
    with pytest.raises(PolarMQError) as caught:
        client_of(stack).submit(TASKS, samples_per_task=8, evaluator="exact_match", model="fake")
    assert caught.value.status == 422
    assert "model 'fake' is not served by the engine, which serves 'fake-model'" in str(
        caught.value
    )
