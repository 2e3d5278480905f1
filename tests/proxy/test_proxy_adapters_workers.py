"""Weight sync with a `--workers N` proxy as real processes in front of fake engine processes:
every worker loads the adapter into every backend (the engine's "already loaded" answer to the
second is success), calls through any worker are served by it, and a worker that is restarted
serves them with it too (it loads the adapter recorded in the database before it serves)."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest
from backends_support import ADMIN_TOKEN, CHAT, QUESTION, wait_until
from proxy_support import FRESH_HTTP, SECRET
from sqlalchemy import Engine
from workers_support import Pinned, fake_engines, live_rollouts, stored_calls, worker_proxy

from polar_mq.capability.tokens import issue_rollout_token
from polar_mq.infra.db import make_session_factory
from polar_mq.policy.proxies import ProxyControl
from polar_mq.policy.service import PolicyService
from polar_mq.testing.fake_vllm import ADAPTER_SHIFT
from tests.conftest import module_database

pytestmark = pytest.mark.spread

pg_url, pg_engine = module_database("polar_mq_adapters_workers")


def first_logprob(pinned: Pinned, rollout: uuid.UUID) -> float:
    body = {"model": "anything", "messages": QUESTION, "logprobs": True}
    headers = {"authorization": f"Bearer {issue_rollout_token(SECRET, rollout, 600)}"}
    response = pinned.client.post(CHAT, json=body, headers=headers)
    assert response.status_code == 200, response.text
    return float(response.json()["choices"][0]["logprobs"]["content"][0]["logprob"])


def test_every_worker_serves_the_published_adapter_and_a_restarted_one_too(
    pg_url: str, pg_engine: Engine, tmp_path: Path
) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 4, "peft_type": "LORA"}')
    with fake_engines(2) as fakes, worker_proxy(pg_url, tmp_path, [f.url for f in fakes]) as proxy:
        first, second = proxy.pinned(0), proxy.pinned(1)
        rollouts = iter(live_rollouts(pg_engine, 8))
        base = first_logprob(first, next(rollouts))
        control = ProxyControl([proxy.url], ADMIN_TOKEN)
        policy = PolicyService(make_session_factory(pg_engine), control)
        update = policy.update(1, False, 10.0, str(adapter))
        assert update.adapter_loaded, update.adapter_loads
        (loads,) = update.adapter_loads
        assert loads.adapter_loads == {f.url: None for f in fakes}
        for fake in fakes:
            models = FRESH_HTTP.get(f"{fake.url}/v1/models").json()["data"]
            assert [m["id"] for m in models][1:] == ["polar-v1"]
        served = [next(rollouts) for _ in range(4)]
        for i, rollout in enumerate(served):
            assert first_logprob((first, second)[i % 2], rollout) == base + ADAPTER_SHIFT

        proxy.flush()
        os.kill(second.pid, signal.SIGKILL)  # its successor loads the adapter before it serves
        wait_until(lambda: second.pid not in proxy.pids() and len(proxy.pids()) == 2, 60)
        successor = proxy.pinned(1)
        late = next(rollouts)
        assert first_logprob(successor, late) == base + ADAPTER_SHIFT
        proxy.flush()
        versions = [c.policy_version for r in [*served, late] for c in stored_calls(pg_engine, r)]
        assert versions == [1] * 5
        assert all(b["adapter"] == "polar-v1" for b in proxy.backends().values())
        assert proxy.stop() == 0
    assert "Traceback" not in proxy.log.read_text()
