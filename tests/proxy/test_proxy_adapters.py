"""Weight sync through the policy control: a LoRA adapter published with a version is loaded into
every backend by the proxies (pause, drain, load, resume) and serves every call after that.

The fake engines load and unload adapters like vLLM and shift every logprob of a call an adapter
served by `ADAPTER_SHIFT`, so each call tells which weights served it; the proxy and the fakes run
on real sockets, the publish goes through `PolicyService` on PostgreSQL as the API's does.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from backends_support import (
    ADMIN_TOKEN,
    CHAT,
    QUESTION,
    FakeProcess,
    Stack,
    auth,
    proxy_stack,
    rollout_preferring,
    wait_until,
)
from proxy_support import FRESH_HTTP
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.policy.proxies import ProxyControl
from polar_mq.policy.service import PolicyService
from polar_mq.policy.weights import Adapter, path_problem
from polar_mq.proxy.backends import BackendPool
from polar_mq.proxy.policy_sync import PolicySync
from polar_mq.testing.fake_vllm import ADAPTER_SHIFT, FakeVllm, create_fake_vllm_app
from polar_mq.testing.servers import serve_in_thread

CALLS = 32
BODY: dict[str, Any] = {"model": "whatever-the-agent-says", "messages": QUESTION, "logprobs": True}


def adapter_dir(tmp_path: Path, name: str = "adapter") -> str:
    """A directory shaped like peft's `save_pretrained` output (the fake reads only the config)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"r": 4, "peft_type": "LORA"}')
    return str(folder)


def fakes_of(stack: Stack) -> dict[str, FakeVllm]:
    return {name: app.state.fake for name, app in stack.fakes.items()}


def call(stack: Stack, rollout: uuid.UUID) -> httpx.Response:
    return stack.client.post(f"{stack.url}{CHAT}", json=BODY, headers=auth(rollout))


def first_logprob(response: httpx.Response) -> float:
    assert response.status_code == 200, response.text
    return float(response.json()["choices"][0]["logprobs"]["content"][0]["logprob"])


def service(factory: sessionmaker[Session], stack: Stack) -> PolicyService:
    return PolicyService(factory, ProxyControl([stack.url], ADMIN_TOKEN))


def served_after_load(fake: FakeVllm, adapter: str) -> list[str]:
    """The models that served this fake's calls after it loaded `adapter`."""
    events = fake.stats.events
    loaded_at = events.index(("load", adapter))
    return [model for kind, model in events[loaded_at:] if kind == "serve"]


def test_publishing_an_adapter_under_load_loses_no_call_and_stamps_each_with_its_weights(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    with proxy_stack(n_fakes=2) as stack, ThreadPoolExecutor(2 * CALLS + 1) as pool:
        fakes = fakes_of(stack)
        base = first_logprob(call(stack, uuid.uuid4()))  # version 0, the base weights
        for fake in fakes.values():
            # in flight until every later call waits at the pause: the drain cannot end (and the
            # resume let a late call through unpaused) however slow the machine is
            fake.held = True
        before = [pool.submit(call, stack, uuid.uuid4()) for _ in range(CALLS)]
        wait_until(lambda: sum(b["in_flight"] for b in stack.backends().values()) == CALLS)
        path = adapter_dir(tmp_path)
        publish = pool.submit(service(db_session_factory, stack).update, 1, False, 30.0, path)
        wait_until(lambda: all(b["paused"] for b in stack.backends().values()))
        after = [pool.submit(call, stack, uuid.uuid4()) for _ in range(CALLS)]
        wait_until(lambda: sum(b["waiting"] for b in stack.backends().values()) == CALLS)
        for fake in fakes.values():
            fake.held = False
        update = publish.result(60)

        assert update.adapter == Adapter("polar-v1", path)
        assert update.drained and update.drained_calls == CALLS and update.adapter_loaded
        assert [r.adapter_loads for r in update.adapter_loads] == [dict.fromkeys(fakes)]
        assert [r.ok for r in update.resumed] == [True]
        old = [first_logprob(f.result(30)) for f in before]
        new = [first_logprob(f.result(30)) for f in after]
        assert set(old) == {base}  # in flight at the pause: finished on the old weights
        assert set(new) == {base + ADAPTER_SHIFT}  # after the resume: the adapter's
        wait_until(lambda: len(stack.sink.rows) == 1 + 2 * CALLS)
        versions = Counter(row["policy_version"] for row in stack.sink.rows)
        assert versions == {0: 1 + CALLS, 1: CALLS}
        for row in stack.sink.rows:  # each call stamped with the version whose weights served it
            shifted = row["logprobs"][0] == base + ADAPTER_SHIFT
            assert shifted == (row["policy_version"] == 1), row
        for fake in fakes.values():  # both carried the adapter before any call after the resume
            assert fake.adapters == {"polar-v1": path}
            assert set(served_after_load(fake, "polar-v1")) <= {"polar-v1"}
        assert sum(f.stats.models["polar-v1"] for f in fakes.values()) == CALLS
        assert all(f.stats.models["polar-v1"] > 0 for f in fakes.values())


def test_a_backend_that_fails_to_load_leaves_the_rotation_until_it_loads(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    with proxy_stack(n_fakes=2) as stack:
        good, bad = stack.fakes
        fakes = fakes_of(stack)
        fakes[bad].fail_loads = True
        update = service(db_session_factory, stack).update(1, False, 5.0, adapter_dir(tmp_path))
        assert update.adapter_loaded is False
        (loads,) = [r.adapter_loads for r in update.adapter_loads]
        assert loads is not None and loads[good] is None and "500" in str(loads[bad])
        assert stack.backends()[bad]["adapter_error"] is not None
        served_before = fakes[bad].stats.requests
        for _ in range(8):  # every rollout goes to the backend that carries the new weights
            assert first_logprob(call(stack, rollout_preferring([bad], stack.fakes))) < 0
        assert fakes[bad].stats.requests == served_before
        assert fakes[good].stats.models["polar-v1"] == 8

        fakes[bad].fail_loads = False  # the health loop loads it, then it serves again
        wait_until(lambda: stack.backends()[bad]["adapter_error"] is None)
        assert stack.backends()[bad]["adapter"] == "polar-v1"
        assert call(stack, rollout_preferring([bad], stack.fakes)).status_code == 200
        assert fakes[bad].stats.models == Counter({"polar-v1": 1})


def test_a_backend_that_joins_later_loads_the_adapter_before_it_serves(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    late = create_fake_vllm_app()
    with proxy_stack(n_fakes=1) as stack, serve_in_thread(late) as late_url:
        update = service(db_session_factory, stack).update(3, False, 5.0, adapter_dir(tmp_path))
        assert update.adapter_loaded
        added = stack.admin("POST", "/admin/backends", {"action": "add", "url": late_url})
        assert added.status_code == 200, added.text
        view = stack.backends()[late_url]
        assert (view["adapter"], view["adapter_error"], view["policy_version"]) == (
            "polar-v3",
            None,
            3,
        )
        rollout = rollout_preferring([late_url], [*stack.fakes, late_url])
        assert call(stack, rollout).status_code == 200
        fake: FakeVllm = late.state.fake
        assert fake.stats.events == [("load", "polar-v3"), ("serve", "polar-v3")]


def test_a_backend_back_from_a_restart_reloads_the_adapter_before_it_serves(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    with FakeProcess() as engine, proxy_stack(n_fakes=1, extra_urls=(engine.url,)) as stack:
        path = adapter_dir(tmp_path)
        assert service(db_session_factory, stack).update(1, False, 5.0, path).adapter_loaded
        served = first_logprob(call(stack, rollout_preferring([engine.url], stack.backends())))
        engine.kill()
        wait_until(lambda: stack.backends()[engine.url]["last_health"] != "ok")
        engine.start()  # a new engine process: it has lost the adapter
        wait_until(lambda: stack.backends()[engine.url]["last_health"] == "ok")
        wait_until(lambda: stack.backends()[engine.url]["adapter_error"] is None)
        models = FRESH_HTTP.get(f"{engine.url}/v1/models").json()["data"]
        assert [m["id"] for m in models][1:] == ["polar-v1"]
        again = first_logprob(call(stack, rollout_preferring([engine.url], stack.backends())))
        assert again == served  # by the adapter again, as before the restart


def test_adapters_no_call_can_use_are_unloaded(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    with proxy_stack(n_fakes=2) as stack:
        fakes = fakes_of(stack)
        policy = service(db_session_factory, stack)
        first = policy.update(1, False, 5.0, adapter_dir(tmp_path, "one"))
        assert first.adapter_loaded
        second = policy.update(2, False, 5.0, adapter_dir(tmp_path, "two"))
        assert second.drained and second.adapter_loaded
        (report,) = second.adapter_loads
        assert sorted(report.unloaded or []) == sorted(f"{name}:polar-v1" for name in fakes)
        for fake in fakes.values():
            assert list(fake.adapters) == ["polar-v2"]
            assert ("unload", "polar-v1") in fake.stats.events
        assert first_logprob(call(stack, uuid.uuid4())) < 0  # served, by polar-v2
        assert sum(f.stats.models["polar-v2"] for f in fakes.values()) == 1


def test_an_adapter_in_use_by_a_call_that_outlived_the_drain_stays_loaded(
    db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    with proxy_stack(n_fakes=1) as stack, ThreadPoolExecutor(1) as pool:
        (fake,) = fakes_of(stack).values()
        policy = service(db_session_factory, stack)
        assert policy.update(1, False, 5.0, adapter_dir(tmp_path, "one")).adapter_loaded
        fake.token_delay_s = 0.05  # about a second: longer than the drain below waits
        slow = pool.submit(call, stack, uuid.uuid4())
        wait_until(lambda: stack.backends()[next(iter(stack.fakes))]["in_flight"] == 1)
        update = policy.update(2, False, 0.1, adapter_dir(tmp_path, "two"))
        assert update.drained is False and update.adapter_loaded
        assert set(fake.adapters) == {"polar-v1", "polar-v2"}  # the slow call still runs on v1
        fake.token_delay_s = 0.0
        assert first_logprob(slow.result(30)) < 0
        assert policy.update(3, False, 5.0, adapter_dir(tmp_path, "three")).drained
        assert set(fake.adapters) == {"polar-v3"}  # the next update that drained unloaded both


def test_the_api_refuses_an_adapter_path_of_the_wrong_shape(tmp_path: Path) -> None:
    assert path_problem("relative/dir") is not None
    assert path_problem("/tmp/has\nnewline") is not None
    (tmp_path / "empty").mkdir()
    problem = path_problem(str(tmp_path / "empty"))
    assert problem is not None and "adapter_config.json" in problem
    assert path_problem(adapter_dir(tmp_path)) is None
    assert path_problem("/on/the/engines/disk/only") is None  # not visible here: the proxy tells


def test_policy_sync_loads_the_recorded_adapter_before_it_lifts_the_pause(tmp_path: Path) -> None:
    """A proxy that starts, or missed the API's push, follows the database: it loads the recorded
    adapter into its backends before it serves the version."""

    async def scenario() -> None:
        fake_app = create_fake_vllm_app()
        pool = BackendPool((CHAT,), transport=httpx.ASGITransport(fake_app))
        backend = pool.add("http://engine:8000", name="engine")
        adapter = Adapter("polar-v4", adapter_dir(tmp_path))
        sync = PolicySync(pool, lambda: (4, False, adapter), interval_s=60)
        await sync.sync_once()
        assert fake_app.state.fake.adapters == {"polar-v4": adapter.path}
        assert (backend.adapter, backend.adapter_error, backend.policy_version) == (
            "polar-v4",
            None,
            4,
        )
        assert not backend.paused and pool.adapter == adapter
        await pool.aclose()

    asyncio.run(scenario())
