"""The proxy side of a policy update: the API's `ProxyControl` pauses, drains, stamps and resumes
a real proxy over its socket, and `PolicySync` makes a proxy follow the recorded policy state."""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor

from backends_support import ADMIN_TOKEN, CHAT, auth, chat_body, proxy_stack, wait_until

from polar_mq.policy.proxies import ProxyControl
from polar_mq.proxy.backends import BackendPool
from polar_mq.proxy.policy_sync import PolicySync


def test_control_drains_in_flight_calls_and_stamps_the_new_version_after_resume() -> None:
    with proxy_stack(n_fakes=2) as stack, ThreadPoolExecutor(2) as pool:
        control = ProxyControl([stack.url], ADMIN_TOKEN)
        fakes = [app.state.fake for app in stack.fakes.values()]
        assert stack.chat(uuid.uuid4()).status_code == 200  # served by version 0
        for fake in fakes:
            fake.token_delay_s = 0.1
        in_flight = uuid.uuid4()
        with stack.client.stream(
            "POST", f"{stack.url}{CHAT}", json=chat_body(True), headers=auth(in_flight)
        ) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            pausing = pool.submit(control.pause, 1, 20.0)
            wait_until(lambda: all(b["paused"] for b in stack.backends().values()))
            held = pool.submit(stack.chat, uuid.uuid4())
            assert not pausing.done()  # waits for the stream in flight
            list(lines)
        (report,) = pausing.result(30)
        assert (report.ok, report.drained, report.in_flight) == (True, True, 0)
        assert report.in_flight_at_pause == 1
        assert not held.done()
        for fake in fakes:
            fake.token_delay_s = 0.0
        (resumed,) = control.resume(1)
        assert resumed.ok and held.result(30).status_code == 200
        wait_until(lambda: len(stack.sink.rows) == 3)
        versions = [row["policy_version"] for row in stack.sink.rows]
        assert versions == [0, 0, 1]  # the drained call kept the version that served it
        assert all(b["paused"] is False for b in stack.backends().values())


def test_control_reports_a_wrong_admin_token_and_an_unreachable_proxy() -> None:
    with proxy_stack(n_fakes=1) as stack:
        reports = ProxyControl([stack.url, "http://127.0.0.1:9"], "wrong").set_version(3)
        assert [r.ok for r in reports] == [False, False]
        assert reports[0].error is not None and "401" in reports[0].error
        assert all(b["policy_version"] == 0 for b in stack.backends().values())


def test_sync_applies_the_recorded_state_only_when_it_changes() -> None:
    async def scenario() -> None:
        pool = BackendPool(("/v1/chat/completions",))
        pool.add("http://127.0.0.1:1", name="a")
        pool.add("http://127.0.0.1:2", name="b")
        recorded: list[tuple[int, bool, None] | None] = [None]
        sync = PolicySync(pool, lambda: recorded[0], interval_s=60)
        await sync.sync_once()
        assert [b.policy_version for b in pool.backends.values()] == [0, 0]
        recorded[0] = (4, True, None)
        await sync.sync_once()
        assert [(b.policy_version, b.paused) for b in pool.backends.values()] == [(4, True)] * 2
        pool.backends["a"].resume()  # an operator's per-backend change ...
        pool.backends["a"].policy_version = 5
        await sync.sync_once()  # ... is not undone while the recorded state is unchanged
        assert (pool.backends["a"].policy_version, pool.backends["a"].paused) == (5, False)
        recorded[0] = (6, False, None)
        await sync.sync_once()
        assert [(b.policy_version, b.paused) for b in pool.backends.values()] == [(6, False)] * 2

        def broken() -> tuple[int, bool, None] | None:
            raise OSError("database down")

        sync.read = broken
        await sync.sync_once()  # unreadable: nothing changes, the proxy keeps serving
        assert [b.policy_version for b in pool.backends.values()] == [6, 6]
        await pool.aclose()

    asyncio.run(scenario())
